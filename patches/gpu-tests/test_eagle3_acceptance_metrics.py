"""Per-request EAGLE-3 acceptance on a GPU server: meta_info's exact accept length
and per-position acceptance, the per-request histogram and per-position counters."""

import unittest

import requests

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
    draft_model = DEFAULT_DRAFT_MODEL_EAGLE3
    extra_args = ["--dtype=float16", "--enable-metrics"]

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
            accepted = meta["spec_num_correct_drafts"]
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

        text = requests.get(self.base_url + "/metrics").text
        self.assertIn("sglang:spec_accept_length_per_request_count", text)
        self.assertIn("sglang:spec_accepted_drafts_by_position_total{", text)
        self.assertIn("sglang:spec_proposed_drafts_by_position_total{", text)
        self.assertIn('position="0"', text)


if __name__ == "__main__":
    unittest.main()
