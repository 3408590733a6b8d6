"""zerocpp's GPT (include/zero/models/gpt.h) in PyTorch, for the Python peers in bench/.

Same modules, shapes, parameter order, initialisation and loss as
zero::models::Gpt: byte vocabulary of 256, tied head, pre-LayerNorm blocks,
scaled_dot_product_attention(is_causal=True), tanh GELU, fp32 cross-entropy.
Sizes are those of `zero-bench fit-plain`: a preset or LxD[xH]; FLOPs per
token are GptConfig::flops_per_token. Used by plain_pytorch.py,
fsdp2_offload.py and deepspeed_offload.py, so the peers train one model; the
helpers at the end (host memory, the results table) are theirs too.
"""
import math

PRESETS = {  # zero::models::gpt_preset: layers, heads, width, context
    "gpt2-tiny": (2, 2, 64, 64),
    "gpt2-small-test": (4, 4, 128, 128),
    "gpt2": (12, 12, 768, 1024),
    "gpt2-medium": (24, 16, 1024, 1024),
    "gpt2-large": (36, 20, 1280, 1024),
    "gpt2-xl": (48, 25, 1600, 1024),
}
VOCAB = 256


def parse_size(spec, seq):
    """(layers, heads, width, context) of a preset or LxD[xH], as zero-bench fit-plain."""
    if spec in PRESETS:
        return PRESETS[spec]
    try:
        v = [int(x) for x in spec.split("x")]
    except ValueError:
        v = []
    if len(v) not in (2, 3):
        raise SystemExit(f"bad size '{spec}': one of {', '.join(PRESETS)} or LAYERSxWIDTH[xHEADS]")
    layers, width = v[0], v[1]
    heads = v[2] if len(v) == 3 else (width // 128 if width % 128 == 0 else width // 64)
    if layers <= 0 or width <= 0 or heads <= 0 or width % heads:
        raise SystemExit(f"bad size '{spec}': layers, width, heads positive, width a multiple of heads")
    return layers, heads, width, max(1024, seq)


def num_parameters(layers, width, context):
    """GptConfig::num_parameters (tied head counted once)."""
    d = width
    block = 2 * d + d * 3 * d + 3 * d + d * d + d + 2 * d + d * 4 * d + 4 * d + 4 * d * d + d
    return VOCAB * d + context * d + layers * block + 2 * d


def flops_per_token(params, layers, width, seq):
    """GptConfig::flops_per_token."""
    return 6.0 * params + 6.0 * layers * seq * width


def build_model_classes(torch):
    import torch.utils.checkpoint  # noqa: F401

    nn = torch.nn
    F = torch.nn.functional

    class CausalSelfAttention(nn.Module):
        def __init__(self, width, heads):
            super().__init__()
            self.n_head = heads
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)

        def forward(self, x):
            B, T, C = x.shape
            qkv = self.qkv(x).view(B, T, 3, self.n_head, C // self.n_head).permute(2, 0, 3, 1, 4)
            y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], is_causal=True)
            return self.proj(y.transpose(1, 2).reshape(B, T, C))

    class Block(nn.Module):
        def __init__(self, width, heads):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.attn = CausalSelfAttention(width, heads)
            self.ln2 = nn.LayerNorm(width)
            self.fc = nn.Linear(width, 4 * width)
            self.proj = nn.Linear(4 * width, width)

        def forward(self, x):
            h = x + self.attn(self.ln1(x))
            return h + self.proj(F.gelu(self.fc(self.ln2(h)), approximate="tanh"))

    class Gpt(nn.Module):
        def __init__(self, layers, heads, width, context):
            super().__init__()
            self.wte = nn.Embedding(VOCAB, width)
            self.wpe = nn.Embedding(context, width)
            self.h = nn.ModuleList([Block(width, heads) for _ in range(layers)])
            self.ln_f = nn.LayerNorm(width)
            self.n_layer = layers
            # Per-block activation checkpointing, as zero::models::Gpt's: forward keeps each
            # block's input, backward re-runs the block (non-reentrant, as PyTorch advises and
            # FSDP2 needs; the work is the C++ model's reentrant one).
            self.checkpoint = False

        @torch.no_grad()
        def init_weights(self):
            """GPT-2's initialisation, as zero::models::Gpt: N(0, 0.02), residual projections scaled
            by 1/sqrt(2 * n_layer), biases 0, LayerNorms 1 and 0 (their defaults, set here because
            the model is built on the meta device and materialised uninitialised)."""
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    residual = "proj.weight" in name
                    p.normal_(0.0, 0.02 / math.sqrt(2.0 * self.n_layer) if residual else 0.02)
                elif "ln" in name and name.endswith("weight"):
                    p.fill_(1.0)
                else:
                    p.zero_()

        def forward(self, idx):
            T = idx.shape[1]
            x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
            ckpt = self.checkpoint and torch.is_grad_enabled()
            for b in self.h:
                x = torch.utils.checkpoint.checkpoint(b, x, use_reentrant=False) if ckpt else b(x)
            return self.ln_f(x) @ self.wte.weight.t()  # tied head

        def loss(self, idx, targets):
            logits = self(idx)
            return F.cross_entropy(logits.float().reshape(-1, VOCAB), targets.reshape(-1))

    return Gpt


def host_available_bytes():
    """MemAvailable of /proc/meminfo in bytes, or None."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def print_results(results, largest):
    """The per-size table every peer prints, then the largest size that fit."""
    print(f"{'size':<16} {'params M':>9} {'seq':>6} {'status':>11} {'step ms':>10} {'tokens/s':>10} "
          f"{'TFLOP/s':>8} {'MFU':>6} {'peak GiB':>9}")
    for r in results:
        line = f"{r['size']:<16} {r['params'] / 1e6:9.1f} {r['seq']:6d} {r['status']:>11}"
        if r["status"] == "ok":
            mfu = f"{100 * r['mfu']:.0f}%" if r.get("mfu") is not None else "-"
            mem = f"{r['peak_mem_gib']:.2f}" if r.get("peak_mem_gib") is not None else "n/a"
            line += f" {r['step_ms']:10.1f} {r['tokens_per_s']:10.0f} {r['tflops']:8.3f} {mfu:>6} {mem:>9}"
        print(line)
    print(f"largest that fits: {largest or 'none'}")
