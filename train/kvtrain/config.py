"""A V4.1 Flash config (config.json, Hugging Face layout) and the layer schedule derived
from it, as the C++ engine derives them (engine/spec/model_config.h, layer_schedule.h).

Every number the model needs comes from the config; nothing here is typed in per model."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import List, Optional

SWA, FULL, REINDEX, REUSE = "swa", "full", "reindex", "reuse"


@dataclass
class LayerPlan:
    index: int
    role: str  # encoder | decoder | draft
    ratio: int
    mode: str = SWA
    kv_layer: int = -1  # whose compressed KV this layer attends to
    index_k_layer: int = -1  # whose index keys its indexer scores
    topk_layer: int = -1  # whose selection it uses
    is_candidate_source: bool = False
    candidate_pool_layer: int = -1
    has_engram: bool = False
    is_dspark_target: bool = False

    @property
    def runs_indexer(self) -> bool:
        return self.mode in (FULL, REINDEX)


@dataclass
class Config:
    raw: dict
    vocab_size: int
    hidden_size: int
    moe_intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    head_dim: int
    qk_rope_head_dim: int
    q_lora_rank: int
    o_lora_rank: int
    o_groups: int
    swiglu_limit: float
    rms_norm_eps: float
    rope_theta: float
    compress_rope_theta: float
    rope_factor: float
    rope_original: int
    beta_fast: float
    beta_slow: float
    n_routed_experts: int
    num_experts_per_tok: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    sliding_window: int
    compress_ratios: List[int]
    kv_source_layer_ids: List[int]
    index_source_layer_ids: List[int]
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    candidate_source_layer_id: int
    candidate_topk_blocks: int
    candidate_block_size: int
    hc_mult: int
    hc_sinkhorn_iters: int
    hc_eps: float
    engram_layer_ids: List[int]
    engram_num_embeddings: List[int]
    engram_max_ngram_size: int
    engram_vocab_size: int
    engram_n_heads: int
    engram_head_dim: int
    engram_pad_token_id: int
    engram_compressed_vocab_size: int
    engram_multipliers: List[List[int]]
    num_nextn_predict_layers: int
    dspark_block_size: int
    dspark_noise_token_id: int
    dspark_target_layer_ids: List[int]
    dspark_markov_rank: int
    dspark_n_routed_experts: int
    dspark_num_experts_per_tok: int
    layers: List[LayerPlan] = field(default_factory=list)
    engram_primes: List[List[int]] = field(default_factory=list)

    @property
    def total_layers(self) -> int:
        return self.num_hidden_layers + self.num_nextn_predict_layers

    @property
    def encoder_layers(self) -> int:
        return self.num_hidden_layers // 2

    @property
    def decoder_full(self) -> int:
        """The decoder's one Full layer (CED: its KV is projected from the encoder output)."""
        return self.encoder_layers

    def experts_of(self, layer: int) -> int:
        return self.n_routed_experts if layer < self.num_hidden_layers else \
            self.dspark_n_routed_experts

    def top_k_of(self, layer: int) -> int:
        return self.num_experts_per_tok if layer < self.num_hidden_layers else \
            self.dspark_num_experts_per_tok


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def engram_primes(c: Config) -> List[List[int]]:
    """Per Engram layer, the primes of (order, head): for each order, from
    engram_vocab_size - 1 up, the next prime no earlier layer, order or head took."""
    seen = set()
    out = []
    for slot, _ in enumerate(c.engram_layer_ids):
        primes = []
        for _order in range(c.engram_max_ngram_size - 1):
            cand = c.engram_vocab_size - 1
            for _head in range(c.engram_n_heads):
                cand += 1
                while not _is_prime(cand) or cand in seen:
                    cand += 1
                seen.add(cand)
                primes.append(cand)
        if sum(primes) != c.engram_num_embeddings[slot]:
            raise ValueError(f"engram_num_embeddings[{slot}] is "
                             f"{c.engram_num_embeddings[slot]} but the primes sum to {sum(primes)}")
        out.append(primes)
    return out


def _nearest_earlier(layers: List[LayerPlan], i: int, pred) -> int:
    for j in range(i - 1, -1, -1):
        if pred(layers[j]):
            return j
    return -1


def build_schedule(c: Config) -> List[LayerPlan]:
    trunk = c.num_hidden_layers
    if len(c.compress_ratios) != c.total_layers:
        raise ValueError(f"compress_ratios has {len(c.compress_ratios)} entries, expected "
                         f"{c.total_layers}")
    if trunk % 2:
        raise ValueError(f"num_hidden_layers is {trunk}, must be even")
    plans: List[LayerPlan] = []
    for i in range(c.total_layers):
        role = "encoder" if i < trunk // 2 else "decoder" if i < trunk else "draft"
        p = LayerPlan(i, role, c.compress_ratios[i], has_engram=i in c.engram_layer_ids,
                      is_dspark_target=i in c.dspark_target_layer_ids)
        plans.append(p)
        if p.ratio == 0:
            continue
        if i in c.kv_source_layer_ids:
            p.mode = FULL
            p.kv_layer = p.index_k_layer = p.topk_layer = i
        else:
            p.mode = REINDEX if i in c.index_source_layer_ids else REUSE
            p.kv_layer = _nearest_earlier(plans, i, lambda q: q.mode == FULL)
            if p.kv_layer < 0:
                raise ValueError(f"layer {i} has no earlier Full layer")
            if p.mode == REINDEX:
                p.index_k_layer = p.kv_layer
                p.topk_layer = i
            else:
                p.topk_layer = _nearest_earlier(plans, i, lambda q: q.runs_indexer)
        p.is_candidate_source = i == c.candidate_source_layer_id
        if p.runs_indexer and i > c.candidate_source_layer_id:
            p.candidate_pool_layer = c.candidate_source_layer_id
    return plans


def load_config(path_or_dict) -> Config:
    if isinstance(path_or_dict, dict):
        raw = path_or_dict
    else:
        with open(path_or_dict) as f:
            raw = json.load(f)
    t = raw.get("text_config", raw)
    rs = t.get("rope_scaling") or {}
    c = Config(
        raw=raw,
        vocab_size=t["vocab_size"], hidden_size=t["hidden_size"],
        moe_intermediate_size=t["moe_intermediate_size"],
        num_hidden_layers=t["num_hidden_layers"], num_attention_heads=t["num_attention_heads"],
        head_dim=t["head_dim"], qk_rope_head_dim=t["qk_rope_head_dim"],
        q_lora_rank=t["q_lora_rank"], o_lora_rank=t["o_lora_rank"], o_groups=t["o_groups"],
        swiglu_limit=float(t["swiglu_limit"]), rms_norm_eps=float(t["rms_norm_eps"]),
        rope_theta=float(t["rope_theta"]), compress_rope_theta=float(t["compress_rope_theta"]),
        rope_factor=float(rs.get("factor", 1.0)),
        rope_original=int(rs.get("original_max_position_embeddings", 0)),
        beta_fast=float(rs.get("beta_fast", 32)), beta_slow=float(rs.get("beta_slow", 1)),
        n_routed_experts=t["n_routed_experts"], num_experts_per_tok=t["num_experts_per_tok"],
        norm_topk_prob=bool(t.get("norm_topk_prob", True)),
        routed_scaling_factor=float(t["routed_scaling_factor"]),
        sliding_window=t["sliding_window"], compress_ratios=list(t["compress_ratios"]),
        kv_source_layer_ids=list(t["kv_source_layer_ids"]),
        index_source_layer_ids=list(t["index_source_layer_ids"]),
        index_n_heads=t["index_n_heads"], index_head_dim=t["index_head_dim"],
        index_topk=t["index_topk"], candidate_source_layer_id=t["candidate_source_layer_id"],
        candidate_topk_blocks=t["candidate_topk_blocks"],
        candidate_block_size=t["candidate_block_size"], hc_mult=t["hc_mult"],
        hc_sinkhorn_iters=t["hc_sinkhorn_iters"], hc_eps=float(t["hc_eps"]),
        engram_layer_ids=list(t.get("engram_layer_ids", [])),
        engram_num_embeddings=list(t.get("engram_num_embeddings", [])),
        engram_max_ngram_size=t.get("engram_max_ngram_size", 0),
        engram_vocab_size=t.get("engram_vocab_size", 0),
        engram_n_heads=t.get("engram_n_heads", 0), engram_head_dim=t.get("engram_head_dim", 0),
        engram_pad_token_id=t.get("engram_pad_token_id", 2),
        engram_compressed_vocab_size=t.get("engram_compressed_vocab_size", t["vocab_size"]),
        engram_multipliers=[list(m) for m in t.get("engram_multipliers", [])],
        num_nextn_predict_layers=t.get("num_nextn_predict_layers", 0),
        dspark_block_size=t.get("dspark_block_size", 0),
        dspark_noise_token_id=t.get("dspark_noise_token_id", 0),
        dspark_target_layer_ids=list(t.get("dspark_target_layer_ids", [])),
        dspark_markov_rank=t.get("dspark_markov_rank", 0),
        dspark_n_routed_experts=t.get("dspark_n_routed_experts", 0),
        dspark_num_experts_per_tok=t.get("dspark_num_experts_per_tok", 0),
    )
    c.layers = build_schedule(c)
    c.engram_primes = engram_primes(c) if c.engram_layer_ids else []
    return c


def parameter_shapes(c: Config) -> List[tuple]:
    """(name, shape) of every tensor, as engine/model/weights.h names them, in its order."""
    D, H, hd, G, hc = c.hidden_size, c.num_attention_heads, c.head_dim, c.o_groups, c.hc_mult
    mix = (2 + hc) * hc
    out: List[tuple] = [("embed.weight", (c.vocab_size, D))]

    def block(l: int, experts: int) -> None:
        p = f"layers.{l}."
        out.extend([(p + "attn_norm.weight", (D,)), (p + "ffn_norm.weight", (D,))])
        for s in ("attn", "ffn"):
            out.extend([(f"{p}hc_{s}_fn", (mix, hc * D)), (f"{p}hc_{s}_base", (mix,)),
                        (f"{p}hc_{s}_scale", (3,))])
        a = p + "attn."
        out.extend([(a + "wq_a.weight", (c.q_lora_rank, D)), (a + "q_norm.weight", (c.q_lora_rank,)),
                    (a + "wq_b.weight", (H * hd, c.q_lora_rank)), (a + "wkv.weight", (hd, D)),
                    (a + "kv_norm.weight", (hd,)), (a + "attn_sink", (H,)),
                    (a + "wo_a.weight", (G * c.o_lora_rank, H * hd // G)),
                    (a + "wo_b.weight", (D, G * c.o_lora_rank))])
        f = p + "ffn."
        out.extend([(f + "gate.weight", (experts, D)), (f + "gate.bias", (experts,))])
        I = c.moe_intermediate_size
        for e in [f"{f}experts.{i}." for i in range(experts)] + [f + "shared_experts."]:
            out.extend([(e + "w1.weight", (I, D)), (e + "w3.weight", (I, D)),
                        (e + "w2.weight", (D, I))])

    for l in range(c.num_hidden_layers):
        plan = c.layers[l]
        block(l, c.n_routed_experts)
        a = f"layers.{l}.attn."
        if plan.mode == FULL:
            out.append((a + "compressor.wkv.weight", (hd, D)))
            if plan.ratio > 1:
                out.append((a + "compressor.wgate.weight", (hd, D)))
            out.extend([(a + "compressor.norm.weight", (hd,)),
                        (a + "indexer.wk.weight", (c.index_head_dim, hd)),
                        (a + "indexer.k_norm.weight", (c.index_head_dim,))])
        if plan.runs_indexer:
            out.extend([(a + "indexer.wq_b.weight",
                         (c.index_n_heads * c.index_head_dim, c.q_lora_rank)),
                        (a + "indexer.weights_proj.weight", (c.index_n_heads, D))])
        if plan.has_engram:
            slot = c.engram_layer_ids.index(l)
            width = (c.engram_max_ngram_size - 1) * c.engram_n_heads * c.engram_head_dim
            e = f"layers.{l}.engram."
            out.extend([(e + "table", (c.engram_num_embeddings[slot], c.engram_head_dim)),
                        (e + "wkv.weight", ((hc + 1) * D, width)), (e + "qw", (hc, D)),
                        (e + "kw", (hc, D))])
    out.extend([("norm.weight", (D,)), ("head.weight", (c.vocab_size, D))])
    if c.num_nextn_predict_layers > 0:
        nt = len(c.dspark_target_layer_ids)
        out.extend([("dspark.main_proj.weight", (D, nt * D)), ("dspark.main_norm.weight", (D,)),
                    ("dspark.norm.weight", (D,)),
                    ("dspark.markov.embed", (c.vocab_size, c.dspark_markov_rank)),
                    ("dspark.markov.head", (c.vocab_size, c.dspark_markov_rank))])
        for l in range(c.num_hidden_layers, c.total_layers):
            block(l, c.dspark_n_routed_experts)
    return out
