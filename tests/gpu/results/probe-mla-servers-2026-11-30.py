"""The probe that produced seed_case_probe in integration-2026-11-30-nvidia-h200.json, as run
(ruff-formatted since): tau and tok/s of the live mla_* servers of that suite run."""

import json
import os
import re
import time
import urllib.request

logs = "/tmp/sglang-ext-logs"


def port(name):
    first = open(f"{logs}/server-{name}.log").readline()
    return int(re.search(r"--port (\d+)", first).group(1))


def gen(p, ids, n):
    req = urllib.request.Request(
        f"http://127.0.0.1:{p}/generate",
        data=json.dumps(
            {
                "input_ids": ids,
                "sampling_params": {"temperature": 0, "max_new_tokens": n, "ignore_eos": True},
            }
        ).encode(),
        headers={"Content-Type": "application/json"},
    )
    return json.loads(urllib.request.urlopen(req, timeout=120).read())


prompts = [json.loads(line) for line in open("/tmp/mla/prompts.jsonl")]
out = {
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    "command": "probe of the live mla_* servers of the suite run (see note)",
}
for name in ("mla_chain", "mla_tree", "mla_stock_seed"):
    try:
        p = port(name)
        res = [gen(p, x["input_ids"], 128) for x in prompts[:16]]
        acc = sum(
            r["meta_info"].get(
                "spec_accepted_draft_tokens",
                r["meta_info"]["completion_tokens"] - 1 - r["meta_info"]["spec_verify_ct"],
            )
            for r in res
        )
        ver = sum(r["meta_info"]["spec_verify_ct"] for r in res)
        t0 = time.perf_counter()
        toks = sum(
            gen(p, x["input_ids"], 256)["meta_info"]["completion_tokens"] for x in prompts[-4:]
        )
        dt = time.perf_counter() - t0
        out[name] = {
            "tau_16x128": round((acc + ver) / ver, 4),
            "tok_s_4x256": round(toks / dt, 1),
            "outputs_16": [r["output_ids"] for r in res],
        }
    except Exception as exc:
        out[name] = {"error": repr(exc)}
    print(name, {k: v for k, v in out[name].items() if k != "outputs_16"}, flush=True)
g = open(f"{logs}/server-mla_guard_seed.log").read()
m = re.search(r"(DrafterConfigError: [^\n]*(?:\n  - [^\n]*)*)", g)
out["guard_error"] = m.group(1) if m else g[-800:]
n = open(f"{logs}/server-mla_nospec.log").read()
out["mla_nospec_error"] = "\n".join(x for x in n.splitlines() if "Error" in x or "error" in x)[
    -1500:
]
print(out["guard_error"])
print(out["mla_nospec_error"][-600:])
json.dump(out, open(os.environ.get("OUT", "/tmp") + "/mla-probe.json", "w"), indent=1)
