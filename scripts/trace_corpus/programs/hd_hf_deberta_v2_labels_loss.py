"""Written for device run 47, traced before it ran (blind): transformers' DeBERTa-v2 (4
layers, 512) for sequence classification with the model's own loss (labels passed in): the
loss first asks which labels are >= 0 with nonzero(), a data-dependent size the tracer sizes
from randint's bounds; fp32, AdamW, batch 16 x 192, 3 steps."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.DebertaV2Config(vocab_size=32000, hidden_size=512, num_hidden_layers=4,
                                   num_attention_heads=8, intermediate_size=2048,
                                   max_position_embeddings=512, relative_attention=True,
                                   pos_att_type=["p2c", "c2p"], position_buckets=256,
                                   num_labels=3)
model = transformers.DebertaV2ForSequenceClassification(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=2e-5)
model.train()
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (16, 192), device=device)
    labels = torch.randint(0, 3, (16,), device=device)
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
