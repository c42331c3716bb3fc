"""Written for device run 40: a small HF Wav2Vec2ForSequenceClassification (the conv feature
encoder with GroupNorm, a weight-normed positional Conv1d, 4 transformer layers of 256)
trained on 2 s of 16 kHz audio, batch 8, with the feature encoder frozen, AdamW (foreach),
3 steps."""
import os

import torch
from transformers import Wav2Vec2Config, Wav2Vec2ForSequenceClassification

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
cfg = Wav2Vec2Config(hidden_size=256, num_hidden_layers=4, num_attention_heads=4,
                     intermediate_size=1024, num_labels=6, conv_dim=(256,) * 7,
                     num_conv_pos_embeddings=64, num_conv_pos_embedding_groups=16,
                     mask_time_prob=0.0)
model = Wav2Vec2ForSequenceClassification(cfg).to(device)
model.freeze_feature_encoder()
opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
for step in range(3):
    wav = torch.randn(8, 32000, device=device)
    y = torch.randint(0, 6, (8,), device=device)
    loss = model(input_values=wav, labels=y).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
print(float(loss))
