"""Written for device run 28: transformers' Phi (partial rotary, parallel blocks) in fp16,
evaluated for perplexity over 6 batches of growing length (128 to 768) under
torch.inference_mode, keeping each batch's loss as a Python float."""
import os

import torch
import transformers

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
cfg = transformers.PhiConfig(hidden_size=768, intermediate_size=3072, num_hidden_layers=4,
                             num_attention_heads=12, vocab_size=24000, partial_rotary_factor=0.5,
                             max_position_embeddings=1024)
model = transformers.PhiForCausalLM(cfg).to(device=device, dtype=torch.float16).eval()
losses = []
with torch.inference_mode():
    for seq in (128, 256, 384, 512, 640, 768):
        ids = torch.randint(0, cfg.vocab_size, (4, seq), device=device)
        losses.append(model(input_ids=ids, labels=ids).loss.item())
print(len(losses))
