"""Written for device run 39: a small HF Whisper (2 encoder and 2 decoder layers, d_model 256,
80 mel bins x 3000 frames, so two Conv1d and 1500 encoder positions) trained on random
features and 48-token labels with AdamW (foreach) for 2 steps, then one eval forward under
torch.no_grad."""
import os

import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration

device = os.environ.get("CORPUS_DEVICE", "cuda")
torch.manual_seed(0)
cfg = WhisperConfig(vocab_size=4000, num_mel_bins=80, d_model=256, encoder_layers=2,
                    decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
                    encoder_ffn_dim=1024, decoder_ffn_dim=1024, max_source_positions=1500,
                    max_target_positions=128, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                    decoder_start_token_id=1)
model = WhisperForConditionalGeneration(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(2):
    feats = torch.randn(8, 80, 3000, device=device)
    labels = torch.randint(3, 4000, (8, 48), device=device)
    loss = model(input_features=feats, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
model.eval()
with torch.no_grad():
    logits = model(input_features=feats, labels=labels).logits
print(float(loss), tuple(logits.shape))
