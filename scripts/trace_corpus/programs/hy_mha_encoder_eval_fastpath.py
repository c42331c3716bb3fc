"""Written for device run 29: PyTorch's own transformer layers on their inference fast paths,
fp32 under torch.no_grad: an nn.TransformerEncoder of 4 post-norm layers (batch_first, GELU,
no mask: aten._transformer_encoder_layer_fwd) over batches of 16 x 256 and 32 x 128, then an
nn.MultiheadAttention called with a boolean key_padding_mask and the default need_weights
(the fast path's math branch: scores kept and averaged over heads)."""
import os

import torch
import torch.nn as nn

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
layer = nn.TransformerEncoderLayer(512, 8, 2048, activation="gelu", batch_first=True)
enc = nn.TransformerEncoder(layer, 4, enable_nested_tensor=False).to(device).eval()
mha = nn.MultiheadAttention(512, 8, batch_first=True).to(device).eval()
outs = []
with torch.no_grad():
    for b, t in ((16, 256), (32, 128)):
        h = enc(torch.randn(b, t, 512, device=device))
        pad = torch.zeros(b, t, dtype=torch.bool, device=device)
        pad[:, t - 16:] = True
        y, w = mha(h, h, h, key_padding_mask=pad)
        outs.append((y.sum(-1), w.mean(-1)))
print([o[0].shape for o in outs], [o[1].shape for o in outs])
