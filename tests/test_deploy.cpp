// deploy/kubernetes/: the manifests validate offline (published Kubernetes schemas via the PyPI package
// kubernetes-validate, strict) and agree with each other and with llm-server (deploy/kubernetes/check.py);
// a broken copy is caught.
#include <doctest/doctest.h>

#include <string>

#include <unistd.h>

#include "util.hpp"

TEST_CASE("deploy: the Kubernetes manifests validate and agree with llm-server; broken ones are caught") {
    std::string out;
    int rc = testutil::run("python3 deploy/kubernetes/check.py --server ./llm-server 2>&1", &out);
    CHECK_MESSAGE(rc == 0, out);
    CHECK(out.find(" 0 problems") != std::string::npos);

    // A probe field misspelled, a grace period shorter than preStop + --shutdown-grace, an HPA metric the
    // adapter does not serve, an environment variable the server does not read.
    const std::string bad = "/tmp/llm-test-k8s-" + std::to_string(getpid());
    REQUIRE(testutil::run("rm -rf " + bad + " && cp -r deploy/kubernetes " + bad) == 0);
    REQUIRE(testutil::run("sed -i 's/terminationGracePeriodSeconds: 40/terminationGracePeriodSeconds: 20/; s/periodSeconds: 10/periodSecs: 10/;"
                          " s/LLAMA_ARG_CTX_SIZE/LLAMA_ARG_CONTEXT/' " + bad + "/deployment.yaml && "
                          "sed -i 's/llamacpp_requests_deferred/llamacpp_queue/' " + bad + "/hpa.yaml") == 0);
    rc = testutil::run("python3 deploy/kubernetes/check.py " + bad + " --server ./llm-server 2>&1", &out);
    testutil::run("rm -rf " + bad);
    CHECK(rc == 1);
    CHECK(out.find("'periodSecs' was unexpected") != std::string::npos);
    CHECK(out.find("does not cover preStop 5 s + --shutdown-grace 30 s") != std::string::npos);
    CHECK(out.find("metric llamacpp_queue is not produced") != std::string::npos);
    CHECK(out.find("env LLAMA_ARG_CONTEXT is not a variable llm-server reads") != std::string::npos);
    CHECK(out.find(" 5 problems") != std::string::npos);
}
