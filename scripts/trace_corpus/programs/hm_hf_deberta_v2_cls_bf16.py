"""Written for device run 46, traced before it ran (blind): transformers' DeBERTa-v2 (6
layers, 768, disentangled relative-position attention) for sequence classification,
bf16 autocast, AdamW with weight decay on two parameter groups; batch 8 x 256, 3 steps. The
loss is taken from the logits: the model's own, given labels, first asks which labels are
>= 0 with nonzero(), a data-dependent shape the tracer refuses."""
import os

import torch
import torch.nn.functional as F
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.DebertaV2Config(vocab_size=32000, hidden_size=768, num_hidden_layers=6,
                                   num_attention_heads=12, intermediate_size=3072,
                                   max_position_embeddings=512, relative_attention=True,
                                   pos_att_type=["p2c", "c2p"], position_buckets=256,
                                   num_labels=4)
model = transformers.DebertaV2ForSequenceClassification(cfg).to(device)
decay = [p for n, p in model.named_parameters() if p.dim() > 1]
rest = [p for n, p in model.named_parameters() if p.dim() <= 1]
opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                         {"params": rest, "weight_decay": 0.0}], lr=2e-5)
model.train()
for step in range(3):
    ids = torch.randint(0, cfg.vocab_size, (8, 256), device=device)
    labels = torch.randint(0, 4, (8,), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = F.cross_entropy(model(input_ids=ids).logits.float(), labels)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
