#!/usr/bin/env python3
"""Offline checks of the manifests in this folder (run by the test suite; no cluster needed).

  python3 deploy/kubernetes/check.py [DIR] [--server ./llm-server]

1. Every object validates, strictly (no unknown fields), against the published Kubernetes JSON schemas
   bundled in the kubernetes-validate package, for the oldest version the manifests need (1.30: preStop
   sleep); so does each Deployment with hostnetwork-patch.yaml merged in.
2. What the schemas cannot see: the grace period covers preStop plus --shutdown-grace; liveness is
   /health and readiness /health?fail_on_no_slot=1; the Service selects the pods; the HPA scales an
   existing Deployment on metrics the adapter rule produces; kustomization.yaml lists files that exist;
   with --server, every LLAMA_* variable is one that llm-server --help documents.
Exit status 1 with one line per problem.
"""
import copy
import glob
import os
import re
import subprocess
import sys

import kubernetes_validate
import yaml

K8S_VERSION = "1.30.0"
problems = []


def problem(msg):
    problems.append(msg)


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d is not None]


def validate(obj, where):
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)
    except kubernetes_validate.ValidationError as e:
        problem(f"{where}: {e.message} at {'.'.join(str(p) for p in e.path)}")
    except Exception as e:  # unknown kind or version
        problem(f"{where}: {e}")


def merge(base, patch):
    """Strategic merge as far as this patch needs it: maps merge, everything else replaces."""
    out = copy.deepcopy(base)
    for k, v in patch.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def flag_value(args, flag):
    return int(args[args.index(flag) + 1]) if flag in args else None


def check_deployment(d, where):
    pod = d["spec"]["template"]["spec"]
    if d["spec"]["selector"]["matchLabels"].items() - d["spec"]["template"]["metadata"]["labels"].items():
        problem(f"{where}: the selector does not match the pod labels")
    for c in pod["containers"]:
        grace = flag_value(c.get("args", []), "--shutdown-grace")
        sleep = c.get("lifecycle", {}).get("preStop", {}).get("sleep", {}).get("seconds", 0)
        if grace is None:
            problem(f"{where}: no --shutdown-grace in the args")
        elif pod.get("terminationGracePeriodSeconds", 30) < sleep + grace + 1:
            problem(f"{where}: terminationGracePeriodSeconds {pod.get('terminationGracePeriodSeconds', 30)} does not cover "
                    f"preStop {sleep} s + --shutdown-grace {grace} s")
        if c.get("livenessProbe", {}).get("httpGet", {}).get("path") != "/health":
            problem(f"{where}: the liveness probe is not GET /health")
        if c.get("readinessProbe", {}).get("httpGet", {}).get("path") != "/health?fail_on_no_slot=1":
            problem(f"{where}: the readiness probe is not GET /health?fail_on_no_slot=1")
        for e in c.get("env", []):
            yield e["name"]


def main():
    argv = sys.argv[1:]
    server = None
    if "--server" in argv:
        i = argv.index("--server")
        server = argv[i + 1]
        del argv[i:i + 2]
    folder = argv[0] if argv else os.path.dirname(os.path.abspath(__file__))
    skip = {"kustomization.yaml", "hostnetwork-patch.yaml"}
    objects = []
    for path in sorted(glob.glob(os.path.join(folder, "*.yaml"))):
        name = os.path.basename(path)
        if name in skip:
            continue
        for i, obj in enumerate(load_all(path)):
            validate(obj, f"{name}[{i}] {obj.get('kind')}")
            objects.append((name, obj))
    if not objects:
        problem(f"{folder}: no manifests")
    by_kind = {}
    for name, obj in objects:
        by_kind.setdefault(obj.get("kind"), []).append((name, obj))

    patch = load_all(os.path.join(folder, "hostnetwork-patch.yaml"))[0]
    env_names = set()
    for name, d in by_kind.get("Deployment", []):
        env_names |= set(check_deployment(d, name))
        patched = merge(d, patch)
        validate(patched, f"{name} + hostnetwork-patch.yaml")
        if not patched["spec"]["template"]["spec"].get("hostNetwork"):
            problem("hostnetwork-patch.yaml does not set hostNetwork")

    pod_labels = [d["spec"]["template"]["metadata"]["labels"] for _, d in by_kind.get("Deployment", [])]
    for name, s in by_kind.get("Service", []):
        if not any(s["spec"]["selector"].items() <= labels.items() for labels in pod_labels):
            problem(f"{name}: the Service selects no Deployment's pods")

    rules = []
    for name, cm in by_kind.get("ConfigMap", []):
        if "config.yaml" in cm.get("data", {}):
            rules += yaml.safe_load(cm["data"]["config.yaml"]).get("rules", [])
    served = set()
    for r in rules:
        series = re.search(r'\^llamacpp:\(([^)]*)\)\$', r["seriesQuery"])
        if not series or r["name"]["as"] != "llamacpp_${1}":
            problem(f"adapter rule {r['seriesQuery']}: expected llamacpp:(a|b) series renamed to llamacpp_${{1}}")
            continue
        served |= {"llamacpp_" + n for n in series.group(1).split("|")}
    deployments = {d["metadata"]["name"] for _, d in by_kind.get("Deployment", [])}
    for name, h in by_kind.get("HorizontalPodAutoscaler", []):
        if h["spec"]["scaleTargetRef"]["name"] not in deployments:
            problem(f"{name}: scales a Deployment that is not here")
        for m in h["spec"]["metrics"]:
            metric = m.get("pods", {}).get("metric", {}).get("name")
            if metric not in served:
                problem(f"{name}: metric {metric} is not produced by the adapter rule (it serves {sorted(served)})")

    kustomization = os.path.join(folder, "kustomization.yaml")
    if os.path.exists(kustomization):
        for res in load_all(kustomization)[0].get("resources", []):
            if not os.path.exists(os.path.join(folder, res)):
                problem(f"kustomization.yaml: {res} does not exist")

    if server:
        helptext = subprocess.run([server, "--help"], capture_output=True, text=True).stdout
        for n in sorted(env_names):
            if n.startswith("LLAMA_") and f"(env: {n})" not in helptext:
                problem(f"env {n} is not a variable llm-server reads")

    for p in problems:
        print("check.py:", p)
    print(f"check.py: {len(objects)} objects checked against Kubernetes {K8S_VERSION}: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
