"""What the SDK test scripts (openai_client.py, openai_tools.py) share: an openai client of the server under
test, and a check that exits non-zero with a message on the first mismatch and counts the passed ones."""
import sys

import openai


def openai_client(port):
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-no-key-required", max_retries=0, timeout=120)


class Checks:
    def __init__(self):
        self.passed = 0

    def __call__(self, cond, what):
        if not cond:
            sys.exit(f"FAIL: {what}")
        self.passed += 1

    def report(self):
        print(f"ok {self.passed}")
