"""Written for device run 39: an embedding service's loop. A 6-layer HF BertModel in fp16 under
torch.inference_mode encodes batches whose size and padded length change every call (nine
shapes from 4 x 311 to 64 x 19), mean-pools over the attention mask, L2-normalises and moves
each result to the host."""
import os

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertModel

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
model = BertModel(BertConfig(vocab_size=16000, hidden_size=512, num_hidden_layers=6,
                             num_attention_heads=8, intermediate_size=2048,
                             max_position_embeddings=512), add_pooling_layer=False)
model = model.half().to(device).eval()
shapes = [(16, 37), (8, 128), (32, 77), (4, 311), (64, 19), (12, 200), (24, 64), (6, 256),
          (48, 50)]
out = []
with torch.inference_mode():
    for b, t in shapes:
        ids = torch.randint(0, 16000, (b, t), device=device)
        lens = torch.randint(t // 2, t + 1, (b,), device=device)
        mask = (torch.arange(t, device=device)[None, :] < lens[:, None]).long()
        h = model(input_ids=ids, attention_mask=mask).last_hidden_state
        m = mask[..., None].to(h.dtype)
        emb = F.normalize((h * m).sum(1) / m.sum(1), dim=-1)
        out.append(emb.float().cpu())
print(sum(float(e.sum()) for e in out))
