"""Per-request EAGLE-3 acceptance on a GPU server: meta_info's exact accept length
and per-position acceptance, one JSONL object per request, Prometheus histograms and
per-position counters."""

import json
import os
import tempfile
import unittest

import requests
from huggingface_hub import snapshot_download

from sglang.test.ci.ci_register import register_cuda_ci
from sglang.test.server_fixtures.eagle_fixture import PROMPTS, EagleServerBase
from sglang.test.test_utils import (
    DEFAULT_DRAFT_MODEL_EAGLE3,
    DEFAULT_TARGET_MODEL_EAGLE3,
)

register_cuda_ci(est_time=180, suite="stage-b-test-small-1-gpu")


class TestEagle3AcceptanceMetrics(EagleServerBase):
    target_model = DEFAULT_TARGET_MODEL_EAGLE3
    spec_algo = "EAGLE3"
    spec_steps = 3
    spec_topk = 1
    spec_tokens = 4
    extra_args = ["--dtype=float16", "--enable-metrics"]

    @classmethod
    def setUpClass(cls):
        cls.draft_model = snapshot_download(DEFAULT_DRAFT_MODEL_EAGLE3)
        cls.jsonl_dir = tempfile.TemporaryDirectory()
        cls.jsonl = os.path.join(cls.jsonl_dir.name, "acceptance.jsonl")
        os.environ["SGLANG_EXT_ACCEPTANCE_JSONL"] = cls.jsonl
        try:
            super().setUpClass()
        finally:
            del os.environ["SGLANG_EXT_ACCEPTANCE_JSONL"]

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        cls.jsonl_dir.cleanup()

    def test_per_request_acceptance(self):
        metas = []
        for prompt in PROMPTS:
            response = requests.post(
                self.base_url + "/generate",
                json={
                    "text": prompt,
                    "sampling_params": {"temperature": 0, "max_new_tokens": 128},
                },
            )
            self.assertEqual(response.status_code, 200)
            metas.append(response.json()["meta_info"])

        exact = []
        for meta in metas:
            verify = meta["spec_verify_ct"]
            accepted = meta["spec_accepted_draft_tokens"]
            self.assertEqual(accepted, meta["spec_num_correct_drafts"])
            self.assertAlmostEqual(
                meta["spec_accept_length_exact"], (accepted + verify) / verify, places=3
            )
            self.assertEqual(
                meta["spec_proposed_per_position"], [verify] * self.spec_steps
            )
            per_position = meta["spec_accepted_per_position"]
            self.assertEqual(per_position, sorted(per_position, reverse=True))
            self.assertEqual(sum(per_position), accepted)
            exact.append(meta["spec_accept_length_exact"])
        mean_exact = sum(exact) / len(exact)
        print(f"{mean_exact=}")
        self.assertGreater(mean_exact, 2.0)

        with open(self.jsonl) as f:
            records = [json.loads(line) for line in f if line.strip()]
        by_rid = {r["rid"]: r for r in records}
        for meta in metas:
            record = by_rid[meta["id"]]
            self.assertAlmostEqual(
                record["accept_length"], meta["spec_accept_length_exact"], places=3
            )

        text = requests.get(self.base_url + "/metrics").text
        self.assertIn("sglang:spec_ext_accept_length_count", text)
        self.assertIn("sglang:spec_ext_accepted_draft_tokens_total{", text)
        self.assertIn('position="0"', text)


if __name__ == "__main__":
    unittest.main()
