"""Written for device run 39: knowledge distillation. A 6-layer HF BERT teacher in eval mode
under torch.no_grad and a 2-layer student, both under bf16 autocast; the loss is the
temperature-scaled KL divergence (log_softmax / softmax, reduction batchmean) plus
cross-entropy; fused AdamW on the student, batch 32 x 128 tokens, 3 steps."""
import os

import torch
import torch.nn.functional as F
from transformers import BertConfig, BertForSequenceClassification

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
base = dict(vocab_size=8000, num_attention_heads=8, max_position_embeddings=256, num_labels=5)
teacher = BertForSequenceClassification(
    BertConfig(hidden_size=512, num_hidden_layers=6, intermediate_size=2048, **base)).to(device)
teacher.eval()
student = BertForSequenceClassification(
    BertConfig(hidden_size=256, num_hidden_layers=2, intermediate_size=1024, **base)).to(device)
opt = torch.optim.AdamW(student.parameters(), lr=2e-4, fused=True)
T = 2.0
for step in range(3):
    ids = torch.randint(0, 8000, (32, 128), device=device)
    y = torch.randint(0, 5, (32,), device=device)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        with torch.no_grad():
            t_logits = teacher(input_ids=ids).logits
        s_logits = student(input_ids=ids).logits
        kl = F.kl_div(F.log_softmax(s_logits.float() / T, -1), F.softmax(t_logits.float() / T, -1),
                      reduction="batchmean") * T * T
        loss = kl + F.cross_entropy(s_logits.float(), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
