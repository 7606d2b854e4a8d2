"""EAGLE-3 fc fusion on a GPU server: fused from the target's captured aux layers,
and an EAGLE-3 drafter served under --speculative-algorithm EAGLE (no aux capture)
refused at startup instead of running unfused at accept length 1.0."""

import subprocess
import sys
import tempfile
import unittest
from types import SimpleNamespace

import requests

from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.run_eval import run_eval
from sglang.test.server_fixtures.eagle_fixture import EagleServerBase
from sglang.test.test_utils import (
    DEFAULT_DRAFT_MODEL_EAGLE3,
    DEFAULT_TARGET_MODEL_EAGLE3,
    DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH,
    DEFAULT_URL_FOR_TEST,
    CustomTestCase,
    terminate_and_kill_process_tree,
)

register_cuda_ci(est_time=240, suite="stage-b-test-small-1-gpu")


class TestEagle3FusesCapturedFeatures(EagleServerBase):
    target_model = DEFAULT_TARGET_MODEL_EAGLE3
    spec_algo = "EAGLE3"
    spec_steps = 2
    spec_topk = 1
    spec_tokens = 3
    draft_model = DEFAULT_DRAFT_MODEL_EAGLE3
    extra_args = ["--dtype=float16", "--chunked-prefill-size", 1024]

    def test_gsm8k_and_accept_length(self):
        args = SimpleNamespace(
            base_url=self.base_url,
            model=self.target_model,
            eval_name="gsm8k",
            api="completion",
            max_tokens=512,
            num_examples=100,
            num_threads=64,
        )
        metrics = run_eval(args)
        print(f"{metrics=}")
        self.assertGreater(metrics["score"], 0.70)

        server_info = requests.get(self.base_url + "/server_info").json()
        avg_spec_accept_length = server_info["internal_states"][0][
            "avg_spec_accept_length"
        ]
        print(f"{avg_spec_accept_length=}")
        # Same configuration and threshold as test_eagle3_basic.py.
        self.assertGreater(avg_spec_accept_length, 2.26)


class TestEagle3DrafterUnderEagleIsRefused(CustomTestCase):
    def test_startup_fails_with_the_reason(self):
        port = DEFAULT_URL_FOR_TEST.rsplit(":", 1)[1]
        command = [
            sys.executable,
            "-m",
            "sglang.launch_server",
            "--model-path",
            DEFAULT_TARGET_MODEL_EAGLE3,
            "--port",
            port,
            "--speculative-algorithm",
            "EAGLE",
            "--speculative-draft-model-path",
            DEFAULT_DRAFT_MODEL_EAGLE3,
            "--speculative-num-steps",
            "3",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "4",
            "--mem-fraction-static",
            "0.7",
        ]
        with tempfile.TemporaryFile("w+") as log:
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            try:
                returncode = process.wait(timeout=DEFAULT_TIMEOUT_FOR_SERVER_LAUNCH)
            finally:
                terminate_and_kill_process_tree(process, wait_timeout=60)
            log.seek(0)
            output = log.read()
        self.assertNotEqual(returncode, 0, output[-3000:])
        self.assertIn("needs --speculative-algorithm EAGLE3", output)


if __name__ == "__main__":
    unittest.main()
