"""What one T5 layer keeps for its backward pass, per token, as zerobench's T5 computes it
(worker/src/model/t5.rs: RMS norms, bias-free products, attention through
scaled_dot_product_attention with an additive position bias, ReLU feed-forward, residual adds;
bf16), measured with the CUDA allocator at several widths: d_model, the attention's width
(heads x d_kv) and the feed-forward's. The encoder layer's bytes per input token, the decoder
layer's per target token with its cross-attention's keys and values (per input token, from a run
at twice the encoder's length) counted apart, each the difference between two batch sizes (so the position bias, shared
across the batch, and every constant drop out), and least squares over the shapes for
bytes = a * d_model + b * inner + c * d_ff per token.

    python3 bench/gpu/t5_kept.py > t5-kept.json
"""
import json
import sys

import torch
import torch.nn.functional as F

from common import probe_header

dev, dt = "cuda", torch.bfloat16
T, TARGET = 512, 128


def rms(x, w):
    return torch.rms_norm(x, w.shape, w, 1e-6)


def attention(x, kv, w, heads, bias):
    b, t, _ = x.shape
    split = lambda y: y.view(b, y.shape[1], heads, -1).transpose(1, 2)
    q, k, v = split(F.linear(x, w[0])), split(F.linear(kv, w[1])), split(F.linear(kv, w[2]))
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=0.0, is_causal=False, scale=1.0)
    return F.linear(y.transpose(1, 2).contiguous().view(b, t, -1), w[3])


def params(d, inner, d_ff, n):
    p = lambda *s: (torch.randn(*s, device=dev, dtype=dt) * 0.02).requires_grad_()
    return {"norms": [p(d) for _ in range(3)], "attn": [[p(inner, d), p(inner, d), p(inner, d), p(d, inner)] for _ in range(n)],
            "wi": p(d_ff, d), "wo": p(d, d_ff)}


def encoder(x, P, heads, bias):
    h = rms(x, P["norms"][0])
    x = x + attention(h, h, P["attn"][0], heads, bias)
    return x + F.linear(F.relu(F.linear(rms(x, P["norms"][1]), P["wi"])), P["wo"])


def decoder(y, enc, P, heads, bias):
    h = rms(y, P["norms"][0])
    y = y + attention(h, h, P["attn"][0], heads, bias)
    y = y + attention(rms(y, P["norms"][1]), enc, P["attn"][1], heads, None)
    return y + F.linear(F.relu(F.linear(rms(y, P["norms"][2]), P["wi"])), P["wo"])


def kept(fn, make_inputs, batch):
    """Bytes the forward of `fn` leaves allocated beyond its inputs and its output."""
    torch.cuda.synchronize()
    inputs = make_inputs(batch)
    before = torch.cuda.memory_allocated()
    out = fn(*inputs)
    torch.cuda.synchronize()
    after = torch.cuda.memory_allocated()
    size = out.numel() * out.element_size()
    del out, inputs
    return after - before - size


def per_token(d, inner, d_ff, heads):
    enc_p, dec_p = params(d, inner, d_ff, 1), params(d, inner, d_ff, 2)
    bias_e = (torch.randn(1, heads, T, T, device=dev, dtype=dt)).requires_grad_()
    bias_d = (torch.randn(1, heads, TARGET, TARGET, device=dev, dtype=dt)).requires_grad_()
    x = lambda b, t: torch.randn(b, t, d, device=dev, dtype=dt).requires_grad_()
    enc = lambda b: (x(b, T), enc_p, heads, bias_e)
    e = [kept(encoder, enc, b) for b in (4, 8)]
    # The decoder at two batch sizes, and at twice the encoder's length: the cross-attention's
    # keys and values are per input token, the rest per target token.
    dec = lambda t_enc: lambda b: (x(b, TARGET), x(b, t_enc), dec_p, heads, bias_d)
    d4, d8, d8_long = kept(decoder, dec(T), 4), kept(decoder, dec(T), 8), kept(decoder, dec(2 * T), 8)
    cross = (d8_long - d8) / (8 * T)
    return {"d_model": d, "inner": inner, "d_ff": d_ff, "heads": heads,
            "encoder_bytes_per_input_token": (e[1] - e[0]) / (4 * T),
            "decoder_bytes_per_target_token": ((d8 - d4) - 4 * T * cross) / (4 * TARGET),
            "decoder_cross_bytes_per_input_token": cross}


def lstsq(rows, key):
    a = torch.tensor([[r["d_model"], r["inner"], r["d_ff"]] for r in rows], dtype=torch.float64)
    y = torch.tensor([[r[key]] for r in rows], dtype=torch.float64)
    coef = torch.linalg.lstsq(a, y).solution.flatten().tolist()
    resid = (a @ torch.tensor(coef, dtype=torch.float64).unsqueeze(1) - y).abs().max().item()
    return {"bytes_per_d_model": coef[0], "bytes_per_inner": coef[1], "bytes_per_d_ff": coef[2], "largest_residual_bytes": resid}


def main():
    shapes = [(512, 512, 2048, 8), (768, 768, 3072, 12), (1024, 1024, 4096, 16), (1024, 4096, 16384, 32),
              (1024, 4096, 4096, 32), (1024, 1024, 16384, 16), (2048, 2048, 4096, 16)]
    # A first pass allocates cuBLAS's and the attention kernels' workspaces, which the allocator
    # counts: measured inside the first shape's smaller batch, they made its difference negative.
    per_token(*shapes[0])
    rows = [per_token(*s) for s in shapes]
    print(json.dumps({**probe_header("bench/gpu/t5_kept.py: bytes one T5 layer keeps for backward per token, bf16"),
                      "sequence": T, "target": TARGET, "rows": rows,
                      "encoder": lstsq(rows, "encoder_bytes_per_input_token"),
                      "decoder": lstsq(rows, "decoder_bytes_per_target_token"),
                      "decoder_cross": lstsq(rows, "decoder_cross_bytes_per_input_token")}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
