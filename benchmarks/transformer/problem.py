"""The transformer problem: a GPT-style byte-level model on the standard library's source,
scored in bits per byte on held-out files (lower is better)."""

from dataclasses import dataclass

from ..language_model.problem import Text


def byte_gpt(width, layers, heads, context, seed):
    """Token and position embeddings, `layers` pre-norm causal self-attention blocks (GELU,
    4x wide MLP, no dropout), a final LayerNorm and a linear head over the 256 bytes."""
    import torch
    from torch import nn

    class ByteGPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.tokens = nn.Embedding(256, width)
            self.positions = nn.Embedding(context, width)
            self.blocks = nn.ModuleList(
                nn.TransformerEncoderLayer(width, heads, 4 * width, 0.0, "gelu",
                                           batch_first=True, norm_first=True)
                for _ in range(layers))
            self.norm = nn.LayerNorm(width)
            self.head = nn.Linear(width, 256, bias=False)
            mask = torch.triu(torch.full((context, context), float("-inf")), 1)
            self.register_buffer("mask", mask, persistent=False)

        def forward(self, x):
            n = x.shape[1]
            h = self.tokens(x) + self.positions(torch.arange(n))
            for block in self.blocks:
                h = block(h, src_mask=self.mask[:n, :n], is_causal=True)
            return self.head(self.norm(h))

    torch.manual_seed(seed)
    return ByteGPT()


@dataclass
class GPTText(Text):
    """`Text` with a transformer: windows of `bptt` bytes (the context), `hidden` wide."""
    layers: int = 2
    heads: int = 4

    def model(self, seed):
        return byte_gpt(self.hidden, self.layers, self.heads, max(self.bptt, self.eval_bptt),
                        seed)
