"""The PyTorch contender: GPT-NeoX and Llama of the row's config (the Hugging Face field
names jaxsmp's configs carry), ``scaled_dot_product_attention``, float32 weights under
bf16 autocast, fused AdamW, clipping at 1.0; each layer ``torch.compile``d on CUDA
(regional compilation: one compile serves every layer), eager on CPU."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F
from torch import nn

from bench.gpucheck.common import random_tokens, time_steps


def rotary(seq: int, dim: int, base: float, device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / base ** (torch.arange(0, dim, 2, device=device).float() / dim)
    angles = torch.outer(torch.arange(seq, device=device).float(), inv)
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """NeoX-style rotation of the first ``cos.shape[-1]`` features of x [b, h, s, d]."""
    d = cos.shape[-1]
    rot, rest = x[..., :d], x[..., d:]
    half = torch.cat([-rot[..., d // 2:], rot[..., :d // 2]], dim=-1)
    return torch.cat([rot * cos + half * sin, rest], dim=-1)


class Block(nn.Module):
    def __init__(self, c: dict, llama: bool):
        super().__init__()
        d, self.heads = c["hidden_size"], c["num_attention_heads"]
        self.kv, self.llama, self.hd = c.get("num_key_value_heads") or self.heads, llama, \
            d // self.heads
        norm = (lambda: nn.RMSNorm(d, eps=c["rms_norm_eps"])) if llama else (
            lambda: nn.LayerNorm(d, eps=c["layer_norm_eps"]))
        self.norm1, self.norm2 = norm(), norm()
        self.qkv = nn.Linear(d, (self.heads + 2 * self.kv) * self.hd, bias=not llama)
        self.out = nn.Linear(d, d, bias=not llama)
        f = c["intermediate_size"]
        self.up = nn.Linear(d, 2 * f if llama else f, bias=not llama)
        self.down = nn.Linear(f, d, bias=not llama)

    def attend(self, x, cos, sin):
        b, s, _ = x.shape
        q, k, v = self.qkv(x).view(b, s, -1, self.hd).transpose(1, 2).split(
            [self.heads, self.kv, self.kv], dim=1)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           enable_gqa=self.kv != self.heads)
        return self.out(o.transpose(1, 2).reshape(b, s, -1))

    def mlp(self, x):
        if self.llama:
            gate, up = self.up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)
        return self.down(F.gelu(self.up(x)))

    def forward(self, x, cos, sin):
        if self.llama:
            x = x + self.attend(self.norm1(x), cos, sin)
            return x + self.mlp(self.norm2(x))
        return x + self.attend(self.norm1(x), cos, sin) + self.mlp(self.norm2(x))


class Model(nn.Module):
    def __init__(self, c: dict, llama: bool):
        super().__init__()
        self.c, self.llama = c, llama
        d = c["hidden_size"]
        self.embed = nn.Embedding(c["vocab_size"], d)
        self.blocks = nn.ModuleList(Block(c, llama) for _ in range(c["num_hidden_layers"]))
        self.norm = nn.RMSNorm(d, eps=c["rms_norm_eps"]) if llama else nn.LayerNorm(
            d, eps=c["layer_norm_eps"])
        self.head = nn.Linear(d, c["vocab_size"], bias=False)

    def forward(self, tokens):
        hd = self.c["hidden_size"] // self.c["num_attention_heads"]
        rot = hd if self.llama else int(hd * self.c["rotary_pct"])
        base = self.c["rope_theta"] if self.llama else self.c["rotary_emb_base"]
        cos, sin = rotary(tokens.shape[1], rot, base, tokens.device)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = self.head(self.norm(x)).float()
        return F.cross_entropy(logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten())


def run_torch(row: dict, deadline: float, target_s: float) -> dict:
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    model = Model(row["config"], row["family"] == "llama").to(device)
    if cuda:
        for block in model.blocks:
            block.compile()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda, foreach=not cuda)
    tokens = torch.from_numpy(random_tokens(row["batch"], row["seq"],
                                            row["config"]["vocab_size"])).long().to(device)

    def once():
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = model(tokens)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    def block(loss):
        if cuda:
            torch.cuda.synchronize()
        return loss
    start = time.perf_counter()
    timing = time_steps(once, block, deadline=deadline, target_s=target_s)
    loss = float(once().detach())
    peak = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
    mode = "torch.compile per layer" if cuda else "eager (CPU: no torch.compile)"
    return {**timing, "loss": loss, "peak_gib": peak, "note": mode,
            "row_torch_s": time.perf_counter() - start}
