"""fixtures.recipe_check (and distill_source_check, its first command): the recipe table,
the wide corpus's selection from site-packages, the arithmetic, and the committed CPU
results read back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_ext_tools.fixtures import distill_source_check as dsc
from sglang_ext_tools.fixtures import recipe_check as rc
from sglang_ext_tools.fixtures.common import distill_split, heldout_split
from sglang_ext_tools.fixtures.data import COPY_LINE_LEN, site_packages_sources

ROOT = Path(__file__).resolve().parents[1]


def test_recipe_tables_are_consistent():
    rc.check_tables()
    old = rc.COMPARISONS["distill-source"]
    assert (old.baseline, old.candidate) == ("train", "split")
    # the 2026-12-02 check: one shared stdlib target, only the distillation prompts differ
    train, split = rc.RECIPES["train"], rc.RECIPES["split"]
    assert not train.target_per_seed and not split.target_per_seed
    assert (train.target_corpus, split.target_corpus) == ("stdlib", "stdlib")
    assert (train.distill_prompts, split.distill_prompts) == ("train", "split")
    new = rc.COMPARISONS["target-corpus"]
    stdlib, wide = rc.RECIPES[new.baseline], rc.RECIPES[new.candidate]
    # a fair pair: a target per seed on both sides, the same distillation prompts; only the
    # corpus (and with it the epochs) differs
    assert stdlib.target_per_seed and wide.target_per_seed
    assert stdlib.distill_prompts == wide.distill_prompts == "split"
    assert (stdlib.target_corpus, stdlib.corpus_scale) == ("stdlib", 1.0)
    assert (wide.target_corpus, wide.corpus_scale) == ("stdlib+site-packages", 4.0)


def test_check_tables_names_the_bad_row(monkeypatch):
    bad = rc.Recipe("odd", "pypi", 1.0, "split", True, "")
    monkeypatch.setitem(rc.RECIPES, "odd", bad)
    with pytest.raises(ValueError, match="recipe 'odd': target_corpus 'pypi'"):
        rc.check_tables()
    monkeypatch.setitem(rc.RECIPES, "odd", rc.Recipe("odd", "stdlib", 2.0, "split", True, ""))
    with pytest.raises(ValueError, match="corpus_scale 2.0"):
        rc.check_tables()
    monkeypatch.delitem(rc.RECIPES, "odd")
    monkeypatch.setitem(
        rc.COMPARISONS, "x", rc.Comparison("x", "stdlib", "nope", "", 1, 1, 1, 1, 1)
    )
    with pytest.raises(ValueError, match=r"comparison 'x': no recipe named \['nope'\]"):
        rc.check_tables()


def test_epochs_is_tokens_seen_over_corpus_tokens():
    # 400 steps x 32 x 128 = 1 638 400 tokens
    assert rc.epochs(400, 163_840) == pytest.approx(10.0)


def _first(rule, exclude=()):
    return next(
        f"pkg/m{i}.py"
        for i in range(10_000)
        if rule(f"pkg/m{i}.py") and f"pkg/m{i}.py" not in exclude
    )


def _site_tree(tmp_path: Path) -> tuple[Path, list[tuple[str, str]]]:
    """A fake site-packages: ordinary files, and one of each kind that must stay out."""
    root = tmp_path / "site-packages"

    def kept(rel):
        return not heldout_split(rel) and not distill_split(rel)

    reserved_text = "\n".join(f"reserved_line_{i}_{'x' * COPY_LINE_LEN}" for i in range(20))
    names = [f"pkg/m{i}.py" for i in range(10_000) if kept(f"pkg/m{i}.py")][:40]
    files = {rel: f"def f{i}():\n    return {i}  # {'y' * 30}\n" for i, rel in enumerate(names)}
    files[_first(heldout_split)] = "held = 'out by path'\n"
    files[_first(distill_split, files)] = "split = 'by path'\n"
    files["vendor/exact_copy.py"] = reserved_text
    # a vendored backport: mostly the reserved file's lines, a few of its own
    files["vendor/near_copy.py"] = reserved_text + "\n" + f"own_{'z' * COPY_LINE_LEN}\n"
    files["pkg/generated.py"] = "t = " + "1" * 2_100 + "\n"
    files["pkg/__pycache__/m0.py"] = "cached = 1\n"
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root, [("stdlib/reserved.py", reserved_text)]


def test_site_packages_selection(tmp_path):
    root, reserved = _site_tree(tmp_path)

    def select(budget):
        return site_packages_sources(budget, reserved, root=root, max_file_chars=2_000)

    everything = select(10**9)
    rels = [rel for rel, _ in everything]
    assert rels == sorted(rels) and len(rels) == 40
    assert not any(heldout_split(r) or distill_split(r) for r in rels)
    assert not {"vendor/exact_copy.py", "vendor/near_copy.py", "pkg/generated.py"} & set(rels)
    assert not any("__pycache__" in r for r in rels)
    # the copies go for what they copy: with nothing reserved they are ordinary files
    unreserved = site_packages_sources(10**9, [], root=root, max_file_chars=2_000)
    assert {"vendor/exact_copy.py", "vendor/near_copy.py"} <= {r for r, _ in unreserved}
    budget = 1_000
    chosen = select(budget)
    assert chosen == select(budget) and 0 < len(chosen) < len(everything)
    total = sum(len(t) for _, t in chosen)
    # up to the budget, and it stopped only where the next file would have passed it
    assert total <= budget < total + max(len(t) for _, t in everything)


def test_tau_ratio_pairs_prompts_across_seeds():
    base = {11: [(4, 4), (2, 4), (8, 4), (0, 4)], 12: [(2, 4), (2, 4), (6, 4), (0, 4)]}
    cand = {11: [(6, 4), (4, 4), (8, 4), (2, 4)], 12: [(2, 4), (4, 4), (6, 4), (4, 4)]}
    out = rc.tau_ratio({"a": base, "b": cand}, "a", "b")
    assert out["ratio"] == pytest.approx(round((36 + 32) / (30 + 26), 4))
    assert out["ratio_per_seed"] == {11: round(36 / 30, 4), 12: round(32 / 26, 4)}
    assert out["ratio_seed_range"] == [round(36 / 30, 4), round(32 / 26, 4)]
    lo, hi = out["ratio_ci95"]
    assert lo <= out["ratio"] <= hi
    with pytest.raises(ValueError, match="one row per prompt"):
        rc.tau_ratio({"a": base, "b": {**cand, 12: cand[12][:-1]}}, "a", "b")
    with pytest.raises(ValueError, match="seeds differ"):
        rc.tau_ratio({"a": base, "b": {11: cand[11]}}, "a", "b")


def test_pooled_tau_is_evaluate_taus_tau():
    # (accepted, cycles) per prompt, pooled: (accepted + cycles) / cycles over all prompts
    rows = [(6, 4), (0, 10)]
    assert rc.pooled_tau(rows) == pytest.approx((6 + 0 + 4 + 10) / 14)


def test_old_command_still_parses(tmp_path, capsys):
    # the documented arguments of distill_source_check; stops before any training
    taken = tmp_path / "taken.json"
    taken.write_text("{}")
    argv = ["--out", str(tmp_path), "--json", str(taken), "--seeds", "11", "12"]
    with pytest.raises(SystemExit):
        dsc.main([*argv, "--target-steps", "600", "--char-budget", "1200000"])
    assert "distill_source_check" in capsys.readouterr().err


def test_committed_distill_source_result_is_consistent():
    path = ROOT / "tests/results/distill-source-2026-12-02-cpu.json"
    result = json.loads(path.read_text())
    assert result["command"].startswith("python -m sglang_ext_tools.fixtures.distill_source_check")
    tau = result["tau"]
    assert result["ratio"] == pytest.approx(tau["split"] / tau["train"], abs=2e-4)
    lo, hi = result["ratio_ci95"]
    assert lo <= result["ratio"] <= hi
    seeds = result["setting"]["seeds"]
    old = rc.COMPARISONS["distill-source"]
    assert set(result["drafters"]) == {
        f"{arm}-seed{n}" for arm in (old.baseline, old.candidate) for n in seeds
    }


def test_committed_target_corpus_result_is_consistent():
    path = ROOT / "tests/results/target-corpus-2026-12-03-cpu.json"
    result = json.loads(path.read_text())
    assert result["command"].startswith(f"python -m {rc.MODULE} --comparison target-corpus")
    tau, seeds = result["tau"], result["setting"]["seeds"]
    assert result["ratio"] == pytest.approx(tau["wide"] / tau["stdlib"], abs=2e-4)
    lo, hi = result["ratio_ci95"]
    assert lo <= result["ratio"] <= hi
    for seed in seeds:
        per_seed = result["tau_per_seed"][str(seed)]
        assert result["ratio_per_seed"][str(seed)] == pytest.approx(
            per_seed["wide"] / per_seed["stdlib"], abs=2e-4
        )
    targets = result["targets"]
    assert set(targets) == {f"{arm}-seed{n}" for arm in ("stdlib", "wide") for n in seeds}
    # the regimes asked for: the stdlib target recites (~12 epochs), the wide one does not
    assert all(targets[f"stdlib-seed{n}"]["epochs"] >= 10 for n in seeds)
    assert all(2 <= targets[f"wide-seed{n}"]["epochs"] <= 4 for n in seeds)
    assert all(t["bench_prompts_in_training_text"] == 0 for t in targets.values())


def test_text_stats_tells_a_loop_from_varied_text():
    loop = [7, 8, 9] * 20
    varied = list(range(60))
    stats = rc.text_stats([loop])
    assert stats["repeated_ngram_fraction"] == pytest.approx(54 / 57, abs=1e-4)
    assert stats["distinct_token_fraction"] == pytest.approx(3 / 60, abs=1e-4)
    assert rc.text_stats([varied]) == {
        "ngram": 4,
        "repeated_ngram_fraction": 0.0,
        "distinct_token_fraction": 1.0,
    }
    pooled = rc.text_stats([loop, varied])  # n-grams pooled, distinct fractions averaged
    assert pooled["repeated_ngram_fraction"] == pytest.approx(54 / 114, abs=1e-4)
    assert pooled["distinct_token_fraction"] == pytest.approx((3 / 60 + 1) / 2, abs=1e-4)


def test_rescored_target_corpus_result_is_the_run_plus_its_greedy_text():
    """The rescore ran the committed run's drafters again from its scratch folder: tau came
    out as recorded (it stops otherwise), and each drafter gained its target's greedy-text
    repetition; nothing else changed."""
    base = json.loads((ROOT / "tests/results/target-corpus-2026-12-03-cpu.json").read_text())
    rescored = json.loads(
        (ROOT / "tests/results/target-corpus-2026-12-03-cpu-rescored.json").read_text()
    )
    assert rescored["rescored"]["tau_reproduced"] is True
    assert "--rescore tests/results/target-corpus-2026-12-03-cpu.json" in (
        rescored["rescored"]["command"]
    )
    stripped = {k: v for k, v in rescored.items() if k != "rescored"}
    stripped["drafters"] = {
        k: {f: x for f, x in v.items() if f != "greedy_text"}
        for k, v in rescored["drafters"].items()
    }
    assert stripped == base
    for drafter in rescored["drafters"].values():
        text = drafter["greedy_text"]
        assert 0 <= text["repeated_ngram_fraction"] <= 1
        assert 0 < text["distinct_token_fraction"] <= 1


def test_rescore_refuses_a_drafter_whose_tau_differs(tmp_path, monkeypatch):
    result = json.loads((ROOT / "tests/results/target-corpus-2026-12-03-cpu.json").read_text())
    shared = rc.Shared(None, [], [], {}, [[1, 2, 3]], ["x"])
    monkeypatch.setattr(rc, "shared_data", lambda *a: shared)
    monkeypatch.setattr(rc.ref, "load_target", lambda path: path)
    monkeypatch.setattr(rc.ref, "load_drafter", lambda path: path)
    monkeypatch.setattr(
        rc.ref, "evaluate_tau", lambda *a, **k: {"tau": 1.5, "per_prompt": [{"tokens": [1]}]}
    )
    refused = r"drafter-stdlib-seed11: tau 1.5000 .* records 2.1495: not the run"
    with pytest.raises(ValueError, match=refused):
        rc.rescore(result, tmp_path, 0, tmp_path / "scratch")


def _distil_arms(monkeypatch, tmp_path, fake_drafter, recipes):
    """rc.distilled for seed 11 of each recipe, with ``fake_drafter`` in place of the
    training and nothing else run."""
    monkeypatch.setattr(rc.msf, "_random_windows", lambda *a: [])
    monkeypatch.setattr(rc.msf, "greedy_continuations", lambda *a: [])
    monkeypatch.setattr(rc.msf, "distilled_drafter", fake_drafter)
    monkeypatch.setattr(rc, "bench_tau", lambda *a: {"tau": 2.0, "per_prompt": [],
                                                     "per_position_acceptance": []})  # fmt: skip
    monkeypatch.setattr(rc, "text_stats", lambda tokens: {})
    args = type("A", (), {"sequences": 4, "seed": 1, "drafter_steps": 400, "new_tokens": 8})()
    target = {"dir": tmp_path, "stream": None, "model": None, "heldout_distill": None}
    shared = type("S", (), {"streams": {"split": None}})()
    for recipe in recipes:
        rc.distilled(args, recipe, target, shared, 11)


def test_drafter_steps_arm_trains_only_the_drafter_longer(monkeypatch, tmp_path):
    """drafter-steps: both arms distil from the same target per seed (the run trains it
    once), and the candidate's drafter gets 3x the comparison's steps."""
    comparison = rc.COMPARISONS["drafter-steps"]
    base, cand = rc.RECIPES[comparison.baseline], rc.RECIPES[comparison.candidate]
    same = ("target_corpus", "corpus_scale", "target_steps_scale", "distill_prompts")
    assert all(getattr(base, k) == getattr(cand, k) for k in same)
    assert (base.drafter_steps(400), cand.drafter_steps(400)) == (400, 1200)
    seen = {}

    def fake_drafter(scratch, scale, model, nbr, seed, out_name, init_from):
        seen[out_name] = scale.drafter_train["steps"]
        assert init_from is None  # both arms start fresh
        return None, {"train": {"last_loss": 1.0}}

    _distil_arms(monkeypatch, tmp_path, fake_drafter, (base, cand))
    assert seen == {"drafter-stdlib-seed11": 400, "drafter-stdlib-drafter-x3-seed11": 1200}


def test_drafter_resume_arm_continues_the_baselines_drafter(monkeypatch, tmp_path):
    """drafter-resume: the same targets as drafter-steps; the candidate starts from the
    baseline's drafter of its seed (trained first) for 2x more steps, drawing other batches."""
    comparison = rc.COMPARISONS["drafter-resume"]
    assert comparison.baseline == rc.COMPARISONS["drafter-steps"].baseline
    base, cand = rc.RECIPES[comparison.baseline], rc.RECIPES[comparison.candidate]
    assert cand.resume_from == comparison.baseline and cand.drafter_steps(400) == 800
    seen = {}

    def fake_drafter(scratch, scale, model, nbr, seed, out_name, init_from):
        seen[out_name] = (scale.drafter_train["steps"], seed, init_from)
        return None, {"train": {"last_loss": 1.0}}

    _distil_arms(monkeypatch, tmp_path, fake_drafter, (base, cand))
    assert seen == {
        "drafter-stdlib-seed11": (400, 11, None),
        "drafter-stdlib-drafter-1+2-seed11": (800, 411, tmp_path / "drafter-stdlib-seed11"),
    }


def test_a_resumed_arm_must_continue_its_comparisons_baseline(monkeypatch):
    bad = rc.Comparison("bad", "train", "stdlib-drafter-1+2", "?", 1, 1, 1, 1, 1)
    monkeypatch.setitem(rc.COMPARISONS, "bad", bad)
    with pytest.raises(ValueError, match="continues 'stdlib', which must be its baseline"):
        rc.check_tables()


def committed_result(comparison: str, date: str = "2026-12-03") -> dict:
    """A committed CPU result of ``comparison``: its command, and its ratio the candidate's
    tau over the baseline's, inside its own interval."""
    result = json.loads((ROOT / f"tests/results/{comparison}-{date}-cpu.json").read_text())
    assert result["command"].startswith(f"python -m {rc.MODULE} --comparison {comparison}")
    arms = rc.COMPARISONS[comparison]
    tau = result["tau"]
    assert result["ratio"] == pytest.approx(tau[arms.candidate] / tau[arms.baseline], abs=2e-4)
    lo, hi = result["ratio_ci95"]
    assert lo <= result["ratio"] <= hi
    return result


def test_committed_target_corpus_long_result_is_consistent():
    result = committed_result("target-corpus-long")
    assert result["ratio_ci95"][1] < 1  # the long wide targets' drafters accept less
    targets = result["targets"]
    # trained 3x as long, the wide targets reach ~6.7 epochs and write less repetitive text
    assert all(6 <= t["epochs"] <= 7.5 for k, t in targets.items() if k.startswith("wide-long"))
    drafters = result["drafters"]
    for seed in result["setting"]["seeds"]:
        loops = drafters[f"stdlib-seed{seed}"]["greedy_text"]["repeated_ngram_fraction"]
        varied = drafters[f"wide-long-seed{seed}"]["greedy_text"]["repeated_ngram_fraction"]
        assert varied < loops


def test_committed_drafter_steps_result_is_consistent():
    result = committed_result("drafter-steps")
    assert result["ratio_ci95"][0] > 1  # the longer-trained drafters accept more
    # one target per seed, shared by both arms: its figures appear once
    assert set(result["targets"]) == {f"stdlib-seed{n}" for n in result["setting"]["seeds"]}
    # the baseline's drafters are the target-corpus-long run's, to the digit (same seeds)
    other = json.loads((ROOT / "tests/results/target-corpus-long-2026-12-03-cpu.json").read_text())
    assert result["tau_per_seed"]["11"]["stdlib"] == other["tau_per_seed"]["11"]["stdlib"]


def test_committed_drafter_resume_result_is_consistent():
    """2026-12-06: the 1x drafter continued for 2x more accepts more than the 1x one; the
    seed whose target trained again to the same losses as on 2026-12-03 (12) sets it beside
    the 3x drafter trained in one go: the continued one gained less (1.109 against 1.190)."""
    result = committed_result("drafter-resume", "2026-12-06")
    assert result["ratio_ci95"][0] > 1
    steps = json.loads((ROOT / "tests/results/drafter-steps-2026-12-03-cpu.json").read_text())
    assert result["targets"]["stdlib-seed12"]["stdlib_train_text"] == (
        steps["targets"]["stdlib-seed12"]["stdlib_train_text"]
    )
    resumed = result["tau_per_seed"]["12"]
    one_go = steps["tau_per_seed"]["12"]
    assert resumed["stdlib-drafter-1+2"] / resumed["stdlib"] < (
        one_go["stdlib-drafter-x3"] / one_go["stdlib"]
    )


def test_committed_drafter_resume_lr_result_is_consistent():
    """2026-12-06: restarting the continued drafter at 0.3x the peak rate kept less than the
    full-rate restart on the same targets (the two runs' baselines agree to the digit)."""
    low = committed_result("drafter-resume-lr", "2026-12-06")
    full = committed_result("drafter-resume", "2026-12-06")
    for seed, arms in full["tau_per_seed"].items():
        assert low["tau_per_seed"][seed]["stdlib"] == arms["stdlib"]
    assert low["ratio_ci95"][1] < full["ratio"]


def test_committed_target_natural_long_result_is_consistent():
    """2026-12-06 (fourteenth session): the natural target's drafter trained 9x accepts what
    the reciting target's 3x drafter does (its interval holds 1), on the same targets as
    target-natural's to the digit: only the drafter's steps differ between the two runs."""
    result = committed_result("target-natural-long", "2026-12-06")
    lo, hi = result["ratio_ci95"]
    assert lo < 1 < hi
    earlier = json.loads((ROOT / "tests/results/target-natural-2026-12-06-cpu.json").read_text())
    for seed in result["setting"]["seeds"]:
        long, short = f"wide-long-drafter-x9-seed{seed}", f"wide-long-drafter-x3-seed{seed}"
        assert result["targets"][long]["heldout"] == earlier["targets"][short]["heldout"]
        base = f"stdlib-drafter-x3-seed{seed}"
        assert result["drafters"][base]["tau"] == earlier["drafters"][base]["tau"]
        # 9x the steps: a lower drafter loss and more tau than 3x on the same target
        assert (
            result["drafters"][long]["train_last_loss"]
            < earlier["drafters"][short]["train_last_loss"]
        )
        assert result["drafters"][long]["tau"] > earlier["drafters"][short]["tau"]
