"""The PyTorch V4.1 against the C++ engine, which is the reference at inference:

- the KV formats' fake quantization gives the golden vectors' dequantized bits;
- on the engine's own random weights (kvmodel init) and on weights this package exports,
  `kvgen --dump-logits` (CED prefill, then greedy decode) and the PyTorch forward pick the
  same top-1 token at every step, with the largest logit difference at float noise (seen:
  ~6e-7 of the logits' scale) except where a quantization boundary flips (NOISE_BOUND),
  and full-depth prefill (--no-ced) too;
- exported weights pass `kvmodel check`;
- the DSpark drafter proposes the engine's block (Model::Draft) after a prompt;
- a few training steps lower the loss on a fixed batch.

Random prompts and weights take a fresh seed each run, printed (KVC_TEST_SEED replays)."""
import contextlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))

from kvtrain import kernels, safetensors_io, tokenizer  # noqa: E402
from kvtrain.config import load_config  # noqa: E402
from kvtrain.model import (V41, selected_scores, selected_values, topk_ascending,  # noqa: E402
                           topk_indices)
from kvtrain.quant import fake_quant  # noqa: E402

SOURCE = os.environ.get("KVC_SOURCE_DIR", os.path.join(HERE, "..", ".."))
BIN = os.environ.get("KVC_BIN_DIR", os.path.join(SOURCE, "build", "bin"))
MINI = os.path.join(SOURCE, "configs", "mini.json")
# Both sides compute in float32 in different orders (~6e-7 of the logits' scale apart), and
# both fake-quantize the KV (FP8 window, FP4 main and index): a value within that rounding
# of a quantization boundary lands on the neighbouring code on one side. With ~5e5
# quantized values per prompt that happens in roughly a third of random prompts (seen:
# seeds 1122815186, 985605891, 3739977320 with the engine of before and after 2026-12-03
# alike), and moves the logits by 1e-4 … 0.2 of their scale from that step on (enough to
# change a near-tied top-1 at a later step). So of several prompts at least one must agree
# at float noise (NOISE_BOUND) at every step — all six flipping is well under 1 % — and
# every prompt that does must pick the same top-1 at every step; the others are printed.
NOISE_BOUND = 1e-5
PROMPTS = 6


@pytest.fixture
def seed():
    s = int(os.environ.get("KVC_TEST_SEED", int.from_bytes(os.urandom(4), "little")))
    print(f"[seed] KVC_TEST_SEED={s}")
    return s


def run(*args):
    r = subprocess.run(list(args), capture_output=True, text=True)
    assert r.returncode == 0, f"{args[0]} failed: {r.stderr}"
    return r.stdout


def engine_logits(tmp_path, config, weights, prompt, new_tokens, ced=True):
    p = tmp_path / "prompt.txt"
    p.write_text(" ".join(map(str, prompt)))
    dump = tmp_path / "logits.f32"
    out = run(os.path.join(BIN, "kvgen"), "--config", config, "--weights", weights, "--prompt",
              str(p), "--max-new-tokens", str(new_tokens), "--greedy", "--dump-logits", str(dump),
              "--json", *([] if ced else ["--no-ced"]))
    gen = json.loads(out)["generated"]
    vocab = load_config(config).vocab_size
    return gen, np.fromfile(dump, dtype="<f4").reshape(-1, vocab)


def agreement(tmp_path, config, weights, prompt, new_tokens, ced=True):
    """(largest relative logit difference, top-1 equal at every step) of the PyTorch forward
    against kvgen on `prompt` and the tokens kvgen generated after it."""
    c = load_config(config)
    model = V41(c)
    model.load_tensors(safetensors_io.read(weights))
    gen, ref = engine_logits(tmp_path, config, weights, prompt, new_tokens, ced)
    n = len(prompt)
    toks = torch.tensor([prompt + gen[:-1]])
    seg = torch.tensor([max(0, n - c.sliding_window)]) if ced else None
    with torch.no_grad():
        ours = model(toks, dec_start=seg)[0, n - 1:].numpy()
    assert ours.shape == ref.shape, (ours.shape, ref.shape)
    worst = max(float(np.abs(ours[i] - ref[i]).max() / np.abs(ref[i]).max())
                for i in range(ref.shape[0]))
    same_top1 = all(ours[i].argmax() == ref[i].argmax() for i in range(ref.shape[0]))
    print(f"max relative logit difference {worst:.3g} over {ref.shape[0]} steps, "
          f"top-1 {'equal' if same_top1 else 'differs'}")
    return worst, same_top1


def check_prompts(tmp_path, config, weights, prompts, new_tokens, ced=True):
    """At least one prompt at float noise; every prompt at float noise has equal top-1s."""
    runs = [agreement(tmp_path, config, weights, p, new_tokens, ced) for p in prompts]
    exact = [top1 for worst, top1 in runs if worst < NOISE_BOUND]
    assert exact, f"every prompt off by more than float noise: {runs}"
    assert all(exact), f"a prompt at float noise picked another top-1: {runs}"


def test_fake_quantization_gives_the_golden_bits():
    dims = {"main": 512, "index": 128, "swa": 512}
    for fmt, dim in dims.items():
        golden = os.path.join(SOURCE, "tests", "engine", "spec", "golden")
        x = np.fromfile(os.path.join(golden, f"{fmt}_input.f32"), dtype="<f4")
        want = np.fromfile(os.path.join(golden, f"{fmt}_dequant.f32"), dtype="<f4")
        got = fake_quant(torch.from_numpy(x.reshape(-1, dim)), fmt).numpy().reshape(-1)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), fmt


def test_topk_keeps_pinned_blocks_and_breaks_ties_low():
    s = torch.tensor([[1.0, float("inf"), 1.0, float("-inf"), 1.0]])
    assert topk_ascending(s, 3).tolist() == [[True, True, True, False, False]]
    assert topk_ascending(s, 9).tolist() == [[True, True, True, False, True]]


def test_topk_without_a_full_sort_is_a_stable_sorts_first_k(seed):
    """topk_indices and topk_ascending (torch.topk and a tie count) give what a stable
    descending sort's first k give — indices, order and validity — on scores full of ties
    and −inf, at every k up to past the row."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(300):
        n = int(torch.randint(1, 80, (1,), generator=g))
        k = int(torch.randint(0, n + 3, (1,), generator=g))
        s = torch.randint(-3, 4, (3, 5, n), generator=g).float()
        s = s.masked_fill(torch.rand(3, 5, n, generator=g) < 0.3, float("-inf"))
        kk = min(k, n)
        srt = torch.sort(s, dim=-1, descending=True, stable=True)
        idx, ok = topk_indices(s, k)
        assert torch.equal(idx, srt.indices[..., :kk]), (n, k)
        assert torch.equal(ok, srt.values[..., :kk] != float("-inf")), (n, k)
        want = torch.zeros_like(s, dtype=torch.bool)
        want.scatter_(-1, srt.indices[..., :kk], True)
        assert torch.equal(topk_ascending(s, k), want & (s != float("-inf"))), (n, k)


def forms(fused: bool):
    """The fused kernels (kvtrain/kernels.c) or model.py's PyTorch forms."""
    if fused:
        assert kernels.lib() is not None, "the fused kernels did not compile here"
        return contextlib.nullcontext()
    return kernels.torch_forms()


@pytest.mark.parametrize("fused", [True, False])
def test_selected_rows_match_the_gathered_products_and_their_gradients(seed, fused):
    """selected_scores / selected_values (the fused kernel reading the rows in place, or a
    custom backward through a dense scatter and one GEMM per batch row) equal the
    gather-then-multiply they replace, and their gradients pass torch's numerical check, on
    random shapes in float64."""
    torch.manual_seed(seed)
    with forms(fused):
        check_selected_rows()


def check_selected_rows():
    for B, N, H, hd, Nc, k in [(2, 5, 3, 4, 7, 3), (1, 9, 4, 8, 9, 9), (3, 4, 2, 5, 6, 1)]:
        q = torch.randn(B, N, H, hd, dtype=torch.float64, requires_grad=True)
        p = torch.randn(B, N, H, k, dtype=torch.float64, requires_grad=True)
        main = torch.randn(B, Nc, hd, dtype=torch.float64, requires_grad=True)
        idx = torch.stack([torch.stack([torch.randperm(Nc)[:k] for _ in range(N)])
                           for _ in range(B)])
        flat = (idx + torch.arange(B).view(B, 1, 1) * Nc).reshape(-1)
        g = main.reshape(B * Nc, hd)[flat].reshape(B, N, k, hd)
        assert torch.allclose(selected_scores(q, main, idx),
                              torch.einsum("bnhd,bnkd->bnhk", q, g))
        assert torch.allclose(selected_values(p, main, idx),
                              torch.einsum("bnhk,bnkd->bnhd", p, g))
        assert torch.autograd.gradcheck(lambda a, m: selected_scores(a, m, idx), (q, main))
        assert torch.autograd.gradcheck(lambda a, m: selected_values(a, m, idx), (p, main))


def test_logits_agree_with_the_engine_on_its_random_weights(tmp_path, seed):
    rng = np.random.default_rng(seed)
    w = str(tmp_path / "w.safetensors")
    run(os.path.join(BIN, "kvmodel"), "init", "--config", MINI, "--seed", str(seed % 1000000),
        "--out", w)
    prompts = [[int(t) for t in rng.integers(0, 512, int(rng.integers(60, 200)))]
               for _ in range(PROMPTS)]
    check_prompts(tmp_path, MINI, w, prompts, 6, ced=True)
    check_prompts(tmp_path, MINI, w, [p[:int(rng.integers(20, 60))] for p in prompts], 3,
                  ced=False)


def test_exported_weights_load_in_the_engine_and_agree(tmp_path, seed):
    c = load_config(MINI)
    torch.manual_seed(seed)
    model = V41(c, init_seed=seed)
    with torch.no_grad():  # not the init's symmetric values: biases, sinks, norms vary too
        for name in model.names:
            p = model.p(name)
            if p.dim() == 1 and not name.endswith("_scale") and not name.endswith("_base"):
                p.add_(0.1 * torch.randn_like(p))
    w = str(tmp_path / "exported.safetensors")
    safetensors_io.write(w, model.tensors(), {"recipe": "test"})
    out = run(os.path.join(BIN, "kvmodel"), "check", "--config", MINI, "--weights", w)
    assert "matches" in out
    rng = np.random.default_rng(seed)
    prompts = [tokenizer.encode(bytes(rng.integers(32, 127, 90).astype(np.uint8)))
               for _ in range(PROMPTS)]
    check_prompts(tmp_path, MINI, w, prompts, 4, ced=True)


def test_a_few_training_steps_lower_the_loss_on_a_fixed_batch(seed):
    import torch.nn.functional as F
    from kvtrain.train import draft_loss, indexer_loss, resume_starts
    c = load_config(MINI)
    torch.manual_seed(seed)
    model = V41(c, init_seed=seed)
    rng = np.random.default_rng(seed)
    x = torch.from_numpy(rng.integers(3, 259, (2, 97)))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
    losses = []
    for step in range(6):
        aux = []
        enc, dec = resume_starts(rng, 2, 96, c.sliding_window) if step % 2 else (None, None)
        logits, hidden = model(x[:, :-1], enc_start=enc, dec_start=dec, aux=aux, want_hidden=True)
        lm = F.cross_entropy(logits.reshape(-1, c.vocab_size), x[:, 1:].reshape(-1))
        loss = lm + 0.1 * indexer_loss(aux) + 0.5 * draft_loss(model, hidden, x, rng, 1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(lm))
    print("losses", losses)
    assert all(np.isfinite(losses))
    assert losses[-1] < losses[0] - 0.1, losses


@pytest.mark.parametrize("fused", [True, False])
def test_sinkhorn_backward_is_the_reference_gradient(seed, fused):
    """mHC's Sinkhorn with its written-out backward (the fused kernel, or the PyTorch form
    with the token axis last): the reference form's values, and a gradient that passes
    gradcheck (float64, finite differences), on logits wide enough that the softmax is far
    from uniform."""
    with forms(fused):
        check_sinkhorn(seed)


def check_sinkhorn(seed):
    from kvtrain.model import sinkhorn, sinkhorn_reference
    g = torch.Generator().manual_seed(seed)
    C = torch.randn(3, 7, 4, 4, generator=g, dtype=torch.float64) * 3
    a, b = sinkhorn(C, 20, 1e-6), sinkhorn_reference(C, 20, 1e-6)
    print("max |sinkhorn - reference|", float((a - b).abs().max()))
    assert float(a.std()) > 0.05  # not a uniform matrix
    assert torch.allclose(a, b, rtol=1e-12, atol=1e-14)
    x = C[:1, :3].clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda t: sinkhorn(t, 20, 1e-6), (x,))
    up = torch.randn(a.shape, generator=g, dtype=torch.float64)
    x1, x2 = C.clone().requires_grad_(), C.clone().requires_grad_()
    (sinkhorn(x1, 20, 1e-6) * up).sum().backward()
    (sinkhorn_reference(x2, 20, 1e-6) * up).sum().backward()
    assert torch.allclose(x1.grad, x2.grad, rtol=1e-9, atol=1e-12)


def test_kernels_name_bad_input():
    """An index outside main's rows, or an hc the Sinkhorn kernel cannot hold, is refused
    with the values named — not read out of bounds."""
    assert kernels.lib() is not None, "the fused kernels did not compile here"
    main, q = torch.randn(1, 4, 8), torch.randn(1, 2, 3, 8)
    idx = torch.tensor([[[0, 1], [2, 4]]])
    with pytest.raises(ValueError, match=r"indices run 0\.\.4, outside the 4 rows"):
        kernels.SelectedRows.apply(q, main, idx, True)
    with pytest.raises(ValueError, match="hc is 9"):
        kernels.Sinkhorn.apply(torch.randn(2, 9, 9), 20, 1e-6)


def test_fused_hc_post_is_the_batched_product(seed):
    """hc_post's kernel against the einsum form: values in float32 and float64 and a
    gradient through all four inputs that passes gradcheck."""
    from kvtrain.model import hc_post, hc_post_reference
    g = torch.Generator().manual_seed(seed)
    assert kernels.lib() is not None, "the fused kernels did not compile here"
    for dtype, tol in ((torch.float64, 1e-12), (torch.float32, 1e-5)):
        f, R, post, comb = (torch.randn(*s, generator=g, dtype=dtype, requires_grad=True)
                            for s in ((2, 5, 16), (2, 5, 4, 16), (2, 5, 4), (2, 5, 4, 4)))
        a, b = hc_post(f, R, post, comb), hc_post_reference(f, R, post, comb)
        assert a.grad_fn is not None and "HcPost" in type(a.grad_fn).__name__
        assert torch.allclose(a, b, rtol=tol, atol=tol)
        up = torch.randn(a.shape, generator=g, dtype=dtype)
        ga = torch.autograd.grad((a * up).sum(), (f, R, post, comb))
        gb = torch.autograd.grad((b * up).sum(), (f, R, post, comb))
        for x, y in zip(ga, gb):
            assert float(y.abs().max()) > 0.1 and torch.allclose(x, y, rtol=tol, atol=tol)
        if dtype == torch.float64:
            assert torch.autograd.gradcheck(hc_post, (f, R, post, comb))


def test_index_scores_are_the_weighted_relu_of_the_heads(seed):
    """index_scores (a GEMM, then the heads' weighted sum) is Σ_h w_h · relu(q_h · k), with
    and without a graph, and its gradient is that of the definition."""
    from kvtrain.model import index_scores
    g = torch.Generator().manual_seed(seed)
    qi, ik, w = (torch.randn(*s, generator=g, dtype=torch.float64)
                 for s in ((2, 6, 3, 5), (2, 7, 5), (2, 6, 3)))
    want = (torch.einsum("bnhd,bmd->bnhm", qi, ik).clamp_min(0) * w[..., None]).sum(2)
    with torch.no_grad():
        assert torch.allclose(index_scores(qi, ik, w), want, rtol=1e-12, atol=1e-12)
    assert float((want == 0).double().mean()) < 0.5  # the relu cut some, not all
    args = tuple(t.clone().requires_grad_() for t in (qi, ik, w))
    assert torch.allclose(index_scores(*args), want, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(index_scores, args)


def test_indexer_loss_has_the_dense_scores_gradient(seed):
    """The forward scores every query for the selection without a graph, and the indexer's
    loss scores its sampled queries again with one: its value and every parameter's
    gradient are those of the dense way (all queries scored with a graph, then sampled),
    in float64 so that the two orders of summation agree to ~1e-12."""
    import torch.nn.functional as F
    from kvtrain.train import indexer_loss

    def dense_loss(aux, queries=128):  # the computation before 2026-12-05, kept as the oracle
        total = torch.zeros((), dtype=torch.float64)
        for qi, ik, wts, visible, q, main, scale in aux:
            iscore = (F.relu(torch.einsum("bnhd,bmd->bnhm", qi, ik)) * wts[..., None]).sum(2)
            iscore = iscore.masked_fill(~visible[None], float("-inf"))
            rows = visible.any(-1).nonzero(as_tuple=True)[0]
            if rows.numel() > queries:
                rows = rows[torch.randperm(rows.numel())[:queries]]
            vis = visible[rows]
            logits = torch.einsum("bnhd,bmd->bhnm", q[:, rows], main) * scale
            target = torch.softmax(logits.masked_fill(~vis[None, None], float("-inf")), -1).mean(1)
            logp = torch.log_softmax(iscore[:, rows], dim=-1)
            kl = (target * (torch.log(target.clamp(min=1e-12)) - logp)).masked_fill(
                ~vis[None], 0.0).sum(-1)
            total = total + kl.mean()
        return total

    c = load_config(MINI)
    model = V41(c, init_seed=seed).double()
    x = torch.randint(3, 259, (2, 160), generator=torch.Generator().manual_seed(seed))
    grads = []
    for loss_of in (indexer_loss, dense_loss):
        model.zero_grad(set_to_none=True)
        aux = []
        model(x, aux=aux)
        assert aux, "mini.json has indexer layers"
        torch.manual_seed(seed)  # the same sampled queries
        loss = loss_of(aux, 32)  # fewer than the visible queries: sampling is exercised
        loss.backward()
        grads.append((float(loss), {n: p.grad.clone() for n, p in model.named_parameters()
                                     if p.grad is not None}))
    (new, g_new), (old, g_old) = grads
    print("indexer loss", new, old, "parameters with a gradient", len(g_new))
    assert new > 0 and abs(new - old) <= 1e-12 * max(1.0, abs(old))
    assert set(g_new) == set(g_old) and g_new
    for n in g_old:
        assert torch.allclose(g_new[n], g_old[n], rtol=1e-9, atol=1e-12), n


def test_no_position_sees_a_later_token(seed):
    """Causality, in plain and in replay-cut windows: changing the tokens from k on leaves
    the logits before k as they were (up to float noise of other rows' shapes).

    In float64: in float32 the noise (~1e-6, from the experts' batches holding other rows)
    sometimes lands a KV value on the neighbouring FP4/FP8 code, which moves the logits of
    the window after it by up to ~1e-3 (seed 2063699035) — a rounding flip, not a leak. In
    float64 the noise is ~1e-15 and a flip is out of reach, so the bound can be tight."""
    c = load_config(MINI)
    model = V41(c, init_seed=seed).double()
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(3, 259, (2, 90), generator=g)
    k = 40 + int(torch.randint(0, 40, (1,), generator=g))
    y = x.clone()
    y[:, k:] = torch.randint(3, 259, (2, 90 - k), generator=g)
    for enc, dec in [(None, None), (torch.tensor([8, 24]), torch.tensor([16, 32]))]:
        with torch.no_grad():
            a, b = model(x, enc_start=enc, dec_start=dec), model(y, enc_start=enc, dec_start=dec)
        assert float((a[:, :k] - b[:, :k]).abs().max()) < 1e-9
        assert float((a[:, k:] - b[:, k:]).abs().max()) > 1e-2


def torch_first_draft(model, prompt, ced=True):
    """The PyTorch drafter's block after `prompt`, greedy with the Markov bias chained on
    each proposal, as Model::Draft proposes it."""
    c = model.c
    n, W = len(prompt), c.sliding_window
    seg = torch.tensor([max(0, n - W)]) if ced else None
    with torch.no_grad():
        logits, hidden = model(torch.tensor([prompt]), dec_start=seg, want_hidden=True)
        nxt = int(logits[0, -1].argmax())
        first = max(0, n - W)
        ring = model.draft_ring(hidden[:, first:n], torch.arange(first, n))
        base = model.draft_logits(ring, torch.tensor([nxt]), n)[0]
        drafts, prev = [], nxt
        for r in range(c.dspark_block_size):
            prev = int((base[r] + model.markov_bias(torch.tensor([prev]))[0]).argmax())
            drafts.append(prev)
    return drafts


@pytest.mark.parametrize("weights", ["random", "shipped"])
def test_the_drafter_proposes_what_the_engine_proposes(tmp_path, seed, weights):
    """DSpark's draft layers in PyTorch against Model::Draft (kvgen --dspark's first_draft):
    the same block of proposals after the prompt, on random mini weights and on the shipped
    trained small model."""
    rng = np.random.default_rng(seed)
    if weights == "random":
        config, w = MINI, str(tmp_path / "w.safetensors")
        run(os.path.join(BIN, "kvmodel"), "init", "--config", MINI, "--seed",
            str(seed % 1000000), "--out", w)
        prompt = [int(t) for t in rng.integers(3, 259, int(rng.integers(40, 120)))]
    else:
        config = os.path.join(SOURCE, "configs", "small.json")
        w = os.path.join(SOURCE, "train", "weights", "small-replay.safetensors")
        with open(os.path.join(SOURCE, "README.md"), "rb") as f:
            text = f.read()
        at = int(rng.integers(0, len(text) - 400))
        prompt = tokenizer.encode(text[at:at + int(rng.integers(150, 400))])
    c = load_config(config)
    model = V41(c)
    model.load_tensors(safetensors_io.read(w))
    p = tmp_path / "prompt.txt"
    p.write_text(" ".join(map(str, prompt)))
    out = json.loads(run(os.path.join(BIN, "kvgen"), "--config", config, "--weights", w,
                         "--prompt", str(p), "--max-new-tokens", "2", "--greedy", "--dspark",
                         "--json"))
    assert len(out["first_draft"]) == c.dspark_block_size
    assert torch_first_draft(model, prompt) == out["first_draft"]


@pytest.mark.parametrize("variant", ["plain", "replay"])
def test_shipped_weights_load_and_give_their_recorded_held_out_loss(variant):
    """The committed weights are what their recipe says: kvmodel check accepts them, and
    the held-out bits per byte their recipe recorded come back (the same corpus windows)."""
    from kvtrain import corpus
    from kvtrain.train import evaluate
    weights = os.path.join(SOURCE, "train", "weights", f"small-{variant}.safetensors")
    config = os.path.join(SOURCE, "configs", "small.json")
    with open(os.path.join(SOURCE, "train", "weights", f"small-{variant}.recipe.json")) as f:
        recipe = json.load(f)
    assert "matches" in run(os.path.join(BIN, "kvmodel"), "check", "--config", config,
                            "--weights", weights)
    held, manifest = corpus.load(os.path.join(SOURCE, "train", "corpus.json"), "held_out")
    assert manifest["corpus_sha256"] == recipe["corpus_sha256"]
    model = V41(load_config(config))
    model.load_tensors(safetensors_io.read(weights))
    data = np.array(tokenizer.encode(held), dtype=np.int32)
    bpb = evaluate(model, data, recipe["seq"], 8, 1234)
    print(f"{variant}: held-out {bpb:.4f} bits/byte, recorded {recipe['held_out_bits_per_byte']:.4f}")
    assert abs(bpb - recipe["held_out_bits_per_byte"]) < 0.01
