"""CPU tests of the offline EAGLE-3 reference loop (sglang_ext_tools.reference).

Everything is built in-process at toy scale in fp32: a random transformers Llama target
saved to a temp dir, and speculators ``Eagle3DraftModel`` drafters built from config.
"""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("speculators")

from sglang_ext_tools import reference as ref  # noqa: E402

VOCAB = 96
HIDDEN = 32
LAYERS = 4
AUX_IDS = [1, 2, 3]


def _set_threads():
    torch.set_num_threads(1)  # toy matmuls are dominated by thread-pool overhead


@pytest.fixture(scope="module")
def ref_target_dir(tmp_path_factory):
    from transformers import LlamaConfig, LlamaForCausalLM

    _set_threads()
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=LAYERS,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
    )
    model = LlamaForCausalLM(cfg)
    # Larger logits than the 0.02 init: greedy decoding becomes less repetitive.
    with torch.no_grad():
        model.lm_head.weight.mul_(20.0)
    path = tmp_path_factory.mktemp("target")
    model.save_pretrained(str(path))
    return path


@pytest.fixture(scope="module")
def ref_target(ref_target_dir):
    return ref.load_target(ref_target_dir)


def _vocab_mapping(keep_zero: bool, draft_vocab: int = VOCAB // 2):
    ids = torch.arange(draft_vocab) if keep_zero else torch.arange(1, draft_vocab + 1)
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[ids] = True
    d2t = ids - torch.arange(draft_vocab)
    return t2d, d2t


def make_drafter(
    ref_target_dir,
    *,
    num_layers=1,
    norm_output=True,
    norm_before_fc=True,
    fc_norm=False,
    norm_before_residual=True,
    keep_zero=True,
    seed=0,
    attn="sdpa",
    sliding_window=2048,
):
    from speculators.config import SpeculatorsConfig, VerifierConfig
    from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig
    from speculators.proposals.greedy import GreedyTokenProposalConfig
    from transformers import LlamaConfig

    layer_cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=64,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=HIDDEN // 4,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        sliding_window=sliding_window,
        use_sliding_window=True,
        layer_types=["sliding_attention"] * num_layers,
    )
    layer_cfg._attn_implementation = attn
    config = Eagle3SpeculatorConfig(
        transformer_layer_config=layer_cfg,
        draft_vocab_size=VOCAB // 2,
        norm_before_residual=norm_before_residual,
        norm_before_fc=norm_before_fc,
        fc_norm=fc_norm,
        norm_output=norm_output,
        eagle_aux_hidden_state_layer_ids=AUX_IDS,
        speculators_config=SpeculatorsConfig(
            algorithm="eagle3",
            proposal_methods=[GreedyTokenProposalConfig(speculative_tokens=3)],
            default_proposal_method="greedy",
            verifier=VerifierConfig.from_pretrained(str(ref_target_dir)),
        ),
    )
    torch.manual_seed(seed)
    model = Eagle3DraftModel(config)
    model.load_vocab_mappings(*_vocab_mapping(keep_zero))
    model.load_verifier_weights()
    with torch.no_grad():  # make the random drafter's proposals less degenerate
        model.fc.weight.mul_(10.0)
    return model.eval()


@pytest.fixture(scope="module")
def ref_drafter(ref_target_dir):
    return make_drafter(ref_target_dir)


def _prompt(seed: int, n: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, VOCAB, (n,), generator=g).tolist()


# --------------------------------------------------------------------------------------
# Hidden-state conventions
# --------------------------------------------------------------------------------------


def test_collect_hidden_states_conventions(ref_target):
    target = ref_target
    ids = torch.tensor([_prompt(1, 17)])
    logits, hidden = ref.collect_hidden_states(target, ids)
    with torch.no_grad():
        out = target(input_ids=ids, output_hidden_states=True)
    assert len(hidden) == LAYERS + 1
    for k in range(LAYERS):  # entry k = residual stream entering layer k
        torch.testing.assert_close(hidden[k], out.hidden_states[k], atol=0, rtol=0)
    # the last entry is PRE-norm; norm(it) is transformers' (post-norm) hidden_states[-1]
    torch.testing.assert_close(target.model.norm(hidden[-1]), out.hidden_states[-1])
    assert not torch.allclose(hidden[-1], out.hidden_states[-1])
    torch.testing.assert_close(logits, out.logits)


# --------------------------------------------------------------------------------------
# Tie the loop to speculators' own math
# --------------------------------------------------------------------------------------


def _speculators_step_logits(drafter, ids: list[int], aux: torch.Tensor, ttt_steps: int):
    """speculators' teacher-forced forward on shift_batch-aligned inputs; lm_head outputs."""
    seq = len(ids) - 1
    logits = ref.speculators_step_logits(
        drafter,
        aux[:-1][None],  # g_0 .. g_{n-2}
        torch.tensor([ids[1:]]),  # x_1 .. x_{n-1}
        torch.zeros(1, seq, dtype=torch.long),
        ttt_steps,
        position_ids=torch.arange(1, seq + 1)[None],  # shift_batch: start at 1
    )
    assert len(logits) == ttt_steps
    return list(logits)  # ttt_steps x [seq, draft_vocab]


@pytest.mark.parametrize(
    "variant",
    [
        dict(num_layers=1),
        dict(num_layers=2),
        dict(num_layers=1, norm_output=False, norm_before_residual=False),
        dict(num_layers=2, norm_before_fc=False, fc_norm=True),
        dict(num_layers=1, attn="eager"),
        dict(num_layers=2, sliding_window=5),
    ],
    ids=["1layer", "2layer", "no-norm-output", "fc-norm", "eager", "window5"],
)
def test_draft_logits_match_speculators_forward(ref_target_dir, ref_target, variant):
    target = ref_target
    """Step k of our chain == TTT step k of speculators' teacher-forced forward.

    With a binding sliding window only step 0 is comparable: in speculators' TTT mask the
    window of a step-k query stays anchored at the chain start (plus k diagonal keys),
    while at inference (and here) the window ends at the drafted token itself. The
    fixtures use window 2048, which never binds at their sequence lengths.
    """
    drafter = make_drafter(ref_target_dir, seed=3, **variant)
    steps = 1 if variant.get("sliding_window", 2048) < 24 else 3
    ids = _prompt(7, 24)
    _, aux = ref.target_forward(target, ids, AUX_IDS)
    spec = _speculators_step_logits(drafter, ids, aux, ttt_steps=3)
    seq = len(ids) - 1
    checked = 0
    for i in (0, 1, 6, 13, seq - 3):
        # context pairs 0..i, i.e. tokens x_0..x_{i+1}; teacher-forced chain inputs x_{i+2..}
        chain = ref.draft_chain(
            drafter,
            ids[: i + 2],
            aux[: i + 1],
            num_steps=3,
            position_offset=1,
            forced_tokens=ids[i + 2 : i + 4],
        )
        for step in range(steps):
            if i + step >= seq:
                continue
            torch.testing.assert_close(chain.logits[step], spec[step][i], atol=1e-5, rtol=0)
            checked += 1
    assert checked >= 4 * steps


def _chain_step0(drafter, ids, aux, i):
    """Step-0 draft logits after context pairs 0..i (offset 1, as speculators' forward)."""
    return ref.draft_chain(drafter, ids[: i + 2], aux[: i + 1], 1, position_offset=1).logits[0]


def test_window_reference_is_speculators_masked_forward(ref_target_dir, ref_target):
    """With context longer than the window, the chain sees only the last ``S`` keys
    (speculators' ``kv > q - S``), like speculators' own masked forward; under
    ``full_attention`` it sees everything, like the same weights trained without a binding
    window -- and the two differ, so the window is really applied."""
    window = 6
    windowed = make_drafter(ref_target_dir, num_layers=2, seed=5, sliding_window=window)
    unwindowed = make_drafter(ref_target_dir, num_layers=2, seed=5, sliding_window=2048)
    ids = _prompt(11, 32)
    _, aux = ref.target_forward(ref_target, ids, AUX_IDS)
    spec_window = _speculators_step_logits(windowed, ids, aux, ttt_steps=1)[0]
    spec_full = _speculators_step_logits(unwindowed, ids, aux, ttt_steps=1)[0]
    differing = 0
    for i in (0, window - 1, window, 17, len(ids) - 3):
        ours = _chain_step0(windowed, ids, aux, i)
        torch.testing.assert_close(ours, spec_window[i], atol=1e-5, rtol=0)
        with ref.full_attention(windowed):
            ours_full = _chain_step0(windowed, ids, aux, i)
        torch.testing.assert_close(ours_full, spec_full[i], atol=1e-5, rtol=0)
        if i < window:  # the whole context fits the window: the same math
            torch.testing.assert_close(ours, ours_full, atol=1e-6, rtol=0)
        else:
            differing += int((ours - ours_full).abs().max() > 1e-3)
    assert differing == 3
    assert windowed.sliding_window_indices == [0, 1]  # restored after full_attention


def test_position_offset_is_rope_relative(ref_target, ref_drafter):
    target, drafter = ref_target, ref_drafter
    ids = _prompt(11, 30)
    _, aux = ref.target_forward(target, ids[:-1], AUX_IDS)
    a = ref.draft_chain(drafter, ids[:-1], aux[:-1], 3, position_offset=0)
    b = ref.draft_chain(drafter, ids[:-1], aux[:-1], 3, position_offset=1)
    for la, lb in zip(a.logits, b.logits, strict=True):
        torch.testing.assert_close(la, lb, atol=1e-4, rtol=1e-4)


def test_draft_ids_map_through_d2t(ref_drafter):
    drafter = ref_drafter
    d = torch.arange(drafter.draft_vocab_size)
    mapped = ref.drafter_to_target_ids(drafter, d)
    assert torch.equal(mapped, torch.nonzero(drafter.t2d).flatten())


# --------------------------------------------------------------------------------------
# Losslessness and acceptance bookkeeping
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_steps", [1, 3])
def test_lossless_vs_greedy(ref_target, ref_drafter, num_steps):
    target, drafter = ref_target, ref_drafter
    for seed, (n, new) in enumerate([(12, 20), (25, 17), (40, 9)]):
        prompt = _prompt(100 + seed, n)
        res = ref.speculative_generate(target, drafter, prompt, num_steps, new)
        base = ref.greedy_decode(target, prompt, new)
        assert res.tokens == base
        assert ref.greedy_decode(target, prompt, new, use_cache=True) == base
        assert len(res.tokens) == new
        assert 1.0 <= res.tau <= num_steps + 1
        assert all(0 <= a <= num_steps for a in res.accepted_per_cycle)
        assert 1 + sum(res.emitted_per_cycle) == len(res.tokens)
        assert res.num_cycles == len(res.accepted_per_cycle)
        per_pos = res.per_position_acceptance
        assert all(x >= y for x, y in zip(per_pos, per_pos[1:], strict=False))
        expected_tau = (sum(res.accepted_per_cycle) + res.num_cycles) / res.num_cycles
        assert res.tau == pytest.approx(expected_tau)
        assert res.sglang_accept_length == pytest.approx(len(res.tokens) / res.num_cycles)


def test_oracle_proposer_known_acceptance(ref_target, ref_drafter):
    """A proposer that returns the true greedy continuation with a chosen corrupted slot."""
    target, drafter = ref_target, ref_drafter
    num_steps, new = 4, 40
    pattern = [4, 0, 2, 1, 3, 4, 2, 0]
    prompt = _prompt(5, 16)
    base = ref.greedy_decode(target, prompt, new)
    oracle = _pattern_oracle(target, pattern)
    res = ref.speculative_generate(target, drafter, prompt, num_steps, new, proposer=oracle)
    assert res.tokens == base
    expected = [pattern[c % len(pattern)] for c in range(res.num_cycles)]
    assert res.accepted_per_cycle == expected
    # emitted = accepted + 1 except for the truncated last cycle
    assert res.emitted_per_cycle[:-1] == [a + 1 for a in expected[:-1]]
    assert res.emitted_per_cycle[-1] <= expected[-1] + 1
    assert len(res.tokens) == new


def _zero_norm_target(ref_target_dir):
    model = ref.load_target(ref_target_dir)
    with torch.no_grad():
        model.model.norm.weight.zero_()  # all logits exactly 0 -> argmax is token 0
    return model


def test_perfect_and_hopeless_drafters(ref_target_dir):
    """Exact ties by construction: target always predicts 0; drafter too (or never)."""
    target0 = _zero_norm_target(ref_target_dir)
    perfect = make_drafter(ref_target_dir, keep_zero=True)
    hopeless = make_drafter(ref_target_dir, keep_zero=False)  # draft id 0 -> target id 1
    for d in (perfect, hopeless):
        with torch.no_grad():
            d.norm.weight.zero_()
    prompt = _prompt(9, 10)
    for s in (1, 3):
        new = 4 * (s + 1) + 1 + 2  # ends with a truncated cycle when s > 1
        res = ref.speculative_generate(target0, perfect, prompt, s, new)
        assert res.tokens == [0] * new
        assert res.accepted_per_cycle == [s] * res.num_cycles
        assert res.tau == s + 1
        assert res.per_position_acceptance == [1.0] * s
        res = ref.speculative_generate(target0, hopeless, prompt, s, new)
        assert res.tokens == [0] * new
        assert res.accepted_per_cycle == [0] * (new - 1)
        assert res.tau == 1.0
        assert res.per_position_acceptance == [0.0] * s


def test_eos_stops_unless_ignored(ref_target_dir):
    target0 = _zero_norm_target(ref_target_dir)
    perfect = make_drafter(ref_target_dir, keep_zero=True)
    with torch.no_grad():
        perfect.norm.weight.zero_()
    res = ref.speculative_generate(
        target0, perfect, [5, 6, 7], 3, 20, eos_token_id=0, ignore_eos=False
    )
    assert res.tokens == [0] and res.num_cycles == 0
    res = ref.speculative_generate(target0, perfect, [5, 6, 7], 3, 20, eos_token_id=0)
    assert len(res.tokens) == 20


def test_load_drafter_roundtrip(tmp_path, ref_target, ref_drafter):
    target, drafter = ref_target, ref_drafter
    drafter.save_pretrained(str(tmp_path / "d"))
    cfg = json.loads((tmp_path / "d" / "config.json").read_text())
    assert cfg["speculators_model_type"] == "eagle3"
    loaded = ref.load_drafter(tmp_path / "d")
    ids = _prompt(21, 20)
    _, aux = ref.target_forward(target, ids[:-1], AUX_IDS)
    a = ref.draft_chain(drafter, ids[:-1], aux[:-1], 3)
    b = ref.draft_chain(loaded, ids[:-1], aux[:-1], 3)
    assert a.target_ids == b.target_ids
    for la, lb in zip(a.logits, b.logits, strict=True):
        torch.testing.assert_close(la, lb, atol=0, rtol=0)
    assert ref.drafter_aux_layer_ids(loaded) == AUX_IDS


def test_load_drafter_rejects_foreign_keys(tmp_path, ref_drafter):
    drafter = ref_drafter
    from safetensors.torch import load_file, save_file

    drafter.save_pretrained(str(tmp_path / "d"))
    path = tmp_path / "d" / "model.safetensors"
    state = load_file(str(path))
    state["midlayer.hidden_norm.weight"] = state.pop("layers.0.hidden_norm.weight")
    save_file(state, str(path))
    with pytest.raises(ValueError, match="does not match"):
        ref.load_drafter(tmp_path / "d")


def test_evaluate_tau_summary(ref_target, ref_drafter):
    target, drafter = ref_target, ref_drafter
    prompts = [_prompt(300 + i, 10 + 3 * i) for i in range(3)]
    summary = ref.evaluate_tau(
        target, drafter, prompts, num_steps=2, max_new_tokens=9, lossless_check_prompts=2
    )
    assert summary["lossless_check"] == {"checked": 2, "mismatches": 0}
    assert 1.0 <= summary["tau"] <= 3.0
    assert summary["total_tokens"] == 27
    assert len(summary["per_prompt"]) == 3
    assert all(len(p["tokens"]) == 9 for p in summary["per_prompt"])


# --------------------------------------------------------------------------------------
# Teacher-forced acceptance on a given continuation
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layers, window, norm_output, offset", [(1, 2048, True, 0), (2, 5, False, 1), (3, 7, True, 0)]
)
def test_every_position_at_once_is_the_chain_at_each_start(
    ref_target_dir, ref_target, layers, window, norm_output, offset
):
    """The batched proposals (one pass per step over all cycle starts) are draft_chain's at
    every start: multi-layer drafters, a window shorter than the context (so appended pairs
    must see exactly the last keys the chain sees), pre-/post-norm feeds, RoPE offsets."""
    drafter = make_drafter(
        ref_target_dir, num_layers=layers, seed=layers, sliding_window=window,
        norm_output=norm_output, keep_zero=False,
    )  # fmt: skip
    ids = _prompt(70 + layers, 23)
    _, aux = ref.target_forward(ref_target, ids, AUX_IDS)
    table = ref.draft_every_position(drafter, ids, aux[: len(ids) - 1], 3, offset)
    assert len(table) == len(ids) - 1
    for b in range(len(ids) - 1):
        chain = ref.draft_chain(drafter, ids[: b + 2], aux[: b + 1], 3, offset)
        assert table[b] == chain.target_ids, b
    distinct = {tuple(row) for row in table}
    assert len(distinct) > 3  # proposals vary with the start: the comparison is not vacuous


def _pattern_oracle(target, pattern):
    """Proposes the target's greedy continuation with slot ``pattern[call]`` corrupted."""
    calls = {"n": 0}

    def oracle(seq, aux, s):
        assert aux.shape[0] == len(seq) - 1
        cont = ref.greedy_decode(target, seq, s)
        bad = pattern[calls["n"] % len(pattern)]
        calls["n"] += 1
        if bad < s:
            cont[bad] = (cont[bad] + 1) % VOCAB
        return cont

    return oracle


@pytest.mark.parametrize("num_steps", [1, 3])
def test_teacher_forced_on_own_greedy_output_is_speculative_generate(
    ref_target, ref_drafter, num_steps
):
    for seed, (n, new) in enumerate([(12, 20), (25, 17), (40, 9)]):
        prompt = _prompt(400 + seed, n)
        res = ref.speculative_generate(ref_target, ref_drafter, prompt, num_steps, new)
        row = ref.teacher_forced_acceptance(ref_target, ref_drafter, prompt, res.tokens, num_steps)
        assert row["accepted"] == res.accepted_per_cycle
        assert row["emitted"] == res.emitted_per_cycle
        assert row["cycles"] == res.num_cycles and row["tokens"] == res.tokens
        assert row["tau"] == pytest.approx(res.tau)
        assert row["per_position"] == pytest.approx(res.per_position_acceptance)
        assert row["target_disagreements"] == 0


def test_teacher_forced_matches_oracle_runs_including_the_cut_last_cycle(ref_target, ref_drafter):
    """Known, varied acceptance (an oracle proposer), and last cycles whose proposals reach
    past the continuation's end: judged by the target as speculative_generate judges them."""
    pattern, num_steps = [4, 0, 2, 1, 3, 4, 2, 0], 4
    prompt = _prompt(5, 16)
    past_end = 0
    for new in (38, 39, 40, 41):
        res = ref.speculative_generate(
            ref_target,
            ref_drafter,
            prompt,
            num_steps,
            new,
            proposer=_pattern_oracle(ref_target, pattern),
        )
        row = ref.teacher_forced_acceptance(
            ref_target,
            ref_drafter,
            prompt,
            res.tokens,
            num_steps,
            proposer=_pattern_oracle(ref_target, pattern),
        )
        assert row["accepted"] == res.accepted_per_cycle
        assert row["accepted"] == [pattern[c % len(pattern)] for c in range(row["cycles"])]
        past_end += int(row["accepted"][-1] >= row["emitted"][-1])
    assert past_end >= 1  # some last cycle accepted more than it could emit


def test_teacher_forced_counts_against_the_given_tokens(ref_target_dir):
    """Target and drafter always say 0; the given continuation has a 5 at index 6. By hand
    (S = 3, 12 tokens): cycles start at 1, 5, 7, 11; the second stops at the 5 (accepts 1),
    the last has one token left and its other proposals are judged by the target (0 = 0)."""
    target0 = _zero_norm_target(ref_target_dir)
    perfect = make_drafter(ref_target_dir, keep_zero=True)
    with torch.no_grad():
        perfect.norm.weight.zero_()
    cont = [0] * 12
    cont[6] = 5
    prompt = _prompt(9, 10)
    row = ref.teacher_forced_acceptance(target0, perfect, prompt, cont, 3)
    assert row["accepted"] == [3, 1, 3, 3] and row["emitted"] == [4, 2, 4, 1]
    assert row["cycles"] == 4 and row["tau"] == pytest.approx(14 / 4)
    assert row["accepted_per_position"] == [4, 3, 3]
    assert row["proposed_per_position"] == [4, 4, 4]
    assert row["per_position"] == [1.0, 0.75, 0.75]
    assert row["per_position_conditional"] == [1.0, 0.75, 1.0]
    assert row["target_disagreements"] == 1  # the target would have said 0 at index 6
    cut = ref.teacher_forced_acceptance(target0, perfect, prompt, cont, 3, judge_past_end=False)
    assert cut["accepted"] == [3, 1, 3, 1] and cut["emitted"] == row["emitted"]
    # the same continuation, served without the 5: what the loop itself produces
    greedy = ref.speculative_generate(target0, perfect, prompt, 3, 12)
    assert greedy.tokens == [0] * 12 and greedy.accepted_per_cycle == [3, 3, 3]
    empty = ref.teacher_forced_acceptance(target0, perfect, prompt, [], 3)
    assert empty["cycles"] == 0 and empty["tau"] is None
    one = ref.teacher_forced_acceptance(target0, perfect, prompt, [0], 3)
    assert one["cycles"] == 0 and one["tokens"] == [0]


def test_teacher_forced_rows_from_served_outputs(ref_target, ref_drafter):
    from sglang_ext.metrics.acceptance import pooled_per_position
    from sglang_ext_tools.tau_compare import compare

    prompts = [{"id": f"p{i:03d}", "input_ids": _prompt(500 + i, 12 + 2 * i)} for i in range(3)]
    results = [
        ref.speculative_generate(ref_target, ref_drafter, p["input_ids"], 2, 11) for p in prompts
    ]
    outputs = [  # what SGLang's /generate returns (sglang_ext's metrics add the accepted count)
        {
            "output_ids": r.tokens,
            "meta_info": {
                "completion_tokens": len(r.tokens),
                "spec_verify_ct": r.num_cycles,
                "spec_accepted_draft_tokens": sum(r.accepted_per_cycle),
            },
        }
        for r in results
    ]
    rows = ref.teacher_forced_rows(ref_target, ref_drafter, prompts, outputs, num_steps=2)
    assert [r["id"] for r in rows] == ["p000", "p001", "p002"]
    for row, res in zip(rows, results, strict=True):
        assert row["accepted"] == res.accepted_per_cycle
        assert row["served_cycles"] == res.num_cycles
    summary = compare(outputs, rows)
    assert summary["identical_prompts"] == 3 and summary["ratio"] == 1.0
    pooled = pooled_per_position(rows)
    cycles = sum(r.num_cycles for r in results)
    assert pooled == pytest.approx(
        [
            sum(sum(1 for a in r.accepted_per_cycle if a > j) for r in results) / cycles
            for j in range(2)
        ]
    )
    bare = ref.teacher_forced_rows(
        ref_target, ref_drafter, [p["input_ids"] for p in prompts], outputs, num_steps=2
    )
    assert "id" not in bare[0] and bare[0]["accepted"] == rows[0]["accepted"]
    with pytest.raises(ValueError, match="2 prompts but 3"):
        ref.teacher_forced_rows(ref_target, ref_drafter, prompts[:2], outputs, num_steps=2)


@pytest.mark.parametrize("batch", [1, 2, 16])
def test_shared_batched_target_forward_gives_each_drafter_its_own_rows(
    ref_target, ref_target_dir, monkeypatch, batch
):
    """Several drafters on one text, the target run once per `batch` prompts (right-padded)
    and the past-end verifies batched too: the rows equal teacher_forced_acceptance's, one
    prompt and drafter at a time with its own forwards, also for a drafter whose aux ids are
    shifted (it reads other layers of the same forward), for a request that emitted nothing,
    and for last cycles judged past the text's end."""
    trained = make_drafter(ref_target_dir)
    shifted = make_drafter(ref_target_dir, seed=1)
    shifted.config.eagle_aux_hidden_state_layer_ids = [a - 1 for a in AUX_IDS]
    blind = make_drafter(ref_target_dir)  # the GPU off-by-one test's no-features floor
    with torch.no_grad():
        blind.fc.weight.zero_()
    prompts = [{"id": f"p{i}", "input_ids": _prompt(700 + i, 10 + i)} for i in range(5)]
    outputs = [
        {
            "output_ids": ref.speculative_generate(
                ref_target, trained, p["input_ids"], 3, 9 + i
            ).tokens
        }
        for i, p in enumerate(prompts)
    ]
    outputs.insert(2, {"output_ids": []})  # a request that emitted nothing
    prompts.insert(2, {"id": "px", "input_ids": _prompt(703, 8)})
    forwards = []  # (batch rows, width) of each target forward over whole texts
    collect = ref.collect_hidden_states

    def counting(model, input_ids, **kw):
        if model is ref_target:
            forwards.append(tuple(input_ids.shape))
        return collect(model, input_ids, **kw)

    monkeypatch.setattr(ref, "collect_hidden_states", counting)
    drafters = {"trained": trained, "shifted": shifted, "blind": blind}
    shared = ref.teacher_forced_rows_shared(
        ref_target, drafters, prompts, outputs, num_steps=3, batch=batch
    )
    assert len(forwards) == -(-5 // batch)  # the texts, `batch` at a time, for every drafter
    assert max(rows for rows, _ in forwards) == min(batch, 5)
    monkeypatch.setattr(ref, "collect_hidden_states", collect)
    for name, drafter in drafters.items():
        for prompt, output, row in zip(prompts, outputs, shared[name], strict=True):
            alone = ref.teacher_forced_acceptance(
                ref_target, drafter, prompt["input_ids"], output["output_ids"], 3
            )
            assert row == {"id": prompt["id"], **alone}, (name, prompt["id"])
    assert shared["trained"] != shared["shifted"]  # the shift reads other states
    with pytest.raises(ValueError, match="5 prompts but 6"):
        ref.teacher_forced_rows_shared(ref_target, {"t": trained}, prompts[:5], outputs)
    with pytest.raises(ValueError, match="batch must be >= 1"):
        ref.teacher_forced_rows_shared(ref_target, {"t": trained}, prompts, outputs, batch=0)


@pytest.mark.parametrize("batch", [1, 3])
def test_batched_past_end_verifies_judge_as_one_at_a_time(ref_target_dir, batch):
    """The target and the drafter always say 0, the texts are zeros with a 5 in one: every
    last cycle that reaches past the end with its in-range drafts accepted is judged by the
    batched verify, as by the one-at-a-time one (by hand: 6 zeros at S = 3 emit 1 + [4, 1]
    and accept [3, 3], the last cycle 2 drafts past the end)."""
    target0 = _zero_norm_target(ref_target_dir)
    perfect = make_drafter(ref_target_dir, keep_zero=True)
    with torch.no_grad():
        perfect.norm.weight.zero_()
    conts = [[0] * n for n in (6, 7, 8, 9, 10)] + [[0, 0, 5, 0, 0, 0]]
    prompts = [_prompt(900 + i, 8 + i) for i in range(len(conts))]
    outputs = [{"output_ids": c} for c in conts]
    rows = ref.teacher_forced_rows_shared(
        target0, {"p": perfect}, prompts, outputs, 3, batch=batch
    )["p"]
    alone = [
        ref.teacher_forced_acceptance(target0, perfect, q, c, 3)
        for q, c in zip(prompts, conts, strict=True)
    ]
    assert rows == alone
    assert rows[0]["accepted"] == [3, 3] and rows[0]["emitted"] == [4, 1]
    cut = ref.teacher_forced_acceptance(target0, perfect, prompts[0], conts[0], 3,
                                        judge_past_end=False)  # fmt: skip
    assert cut["accepted"] == [3, 1]  # what the judged verify added: 2 drafts past the end
    judged = sum(r["accepted"][-1] >= r["emitted"][-1] for r in alone)
    assert judged >= 4


def test_batched_states_are_each_sequence_alone(ref_target):
    seqs = [_prompt(800 + i, n) for i, n in enumerate((7, 19, 12))]
    for (logits, hidden), seq in zip(
        ref.batched_hidden_states(ref_target, seqs), seqs, strict=True
    ):
        one_logits, one_hidden = ref.collect_hidden_states(ref_target, torch.tensor([seq]))
        assert logits.shape == one_logits.shape and len(hidden) == len(one_hidden)
        torch.testing.assert_close(logits, one_logits, rtol=1e-5, atol=1e-5)
        for h, one in zip(hidden, one_hidden, strict=True):
            torch.testing.assert_close(h, one, rtol=1e-5, atol=1e-5)


def test_aux_hidden_states_are_the_states_entering_the_layers(ref_target):
    ids = _prompt(3, 15)
    states = ref.aux_hidden_states(ref_target, ids, [0, 2, LAYERS])
    with torch.no_grad():
        out = ref_target(input_ids=torch.tensor([ids]), output_hidden_states=True)
    assert sorted(states) == [0, 2, LAYERS]
    torch.testing.assert_close(states[0], out.hidden_states[0][0], atol=0, rtol=0)
    torch.testing.assert_close(states[2], out.hidden_states[2][0], atol=0, rtol=0)
    # id L: the last layer's output before the final norm
    torch.testing.assert_close(ref_target.model.norm(states[LAYERS]), out.hidden_states[-1][0])
    _, aux = ref.target_forward(ref_target, ids, AUX_IDS)
    cat = torch.cat(list(ref.aux_hidden_states(ref_target, ids, AUX_IDS).values()), -1)
    torch.testing.assert_close(cat, aux, atol=0, rtol=0)


def test_batched_states_on_an_mla_moe_target_are_each_sequence_alone():
    """The GPU suite's reference target is DeepSeek-V3 (MLA, MoE with transformers' eager
    expert loop, yarn rope): right-padded rows route and attend as each sequence alone."""
    from sglang_ext_tools.fixtures.common import dsv3_cfg
    from sglang_ext_tools.fixtures.targets import build_dsv3

    torch.manual_seed(0)
    model = build_dsv3(dsv3_cfg(3, 32, 64, 16, 2, 4, 16, 16, 8, 8, 8), 96).eval()
    seqs = [[(7 * i + 3 * n) % 96 for i in range(n)] for n in (5, 17, 11)]
    with torch.no_grad():
        batched = ref.batched_hidden_states(model, seqs)
        for (logits, hidden), seq in zip(batched, seqs, strict=True):
            one_logits, one_hidden = ref.collect_hidden_states(model, torch.tensor([seq]))
            torch.testing.assert_close(logits, one_logits, rtol=1e-5, atol=1e-5)
            for h, one in zip(hidden, one_hidden, strict=True):
                torch.testing.assert_close(h, one, rtol=1e-5, atol=1e-5)
