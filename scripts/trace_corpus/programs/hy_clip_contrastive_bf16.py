"""Written for device run 29: transformers' CLIPModel (small vision and text towers, random
init) trained with its contrastive loss (return_loss=True) under bf16 autocast, AdamW,
batch 32 (224 x 224 images, 64-token texts), 3 steps."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.CLIPConfig(
    text_config=dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=4,
                     num_attention_heads=6, max_position_embeddings=77, vocab_size=49408),
    vision_config=dict(hidden_size=384, intermediate_size=1536, num_hidden_layers=4,
                       num_attention_heads=6, image_size=224, patch_size=32),
    projection_dim=256)
model = transformers.CLIPModel(cfg).to(device)
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
for step in range(3):
    pix = torch.randn(32, 3, 224, 224, device=device)
    ids = torch.randint(0, 49408, (32, 64), device=device)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
        loss = model(input_ids=ids, pixel_values=pix, return_loss=True).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
print(float(loss))
