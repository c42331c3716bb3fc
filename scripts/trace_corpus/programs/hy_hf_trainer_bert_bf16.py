"""Written for device run 29: transformers' Trainer fine-tuning BertForSequenceClassification
(4 layers, random init) with bf16 mixed precision, its default AdamW and linear schedule,
gradient clipping, batch 16 x 128 from a map-style dataset of dicts, 4 steps, then
Trainer.evaluate on 64 more rows; no checkpoints or reports written outside a temp dir."""
import os
import tempfile

import torch
import transformers
from torch.utils.data import Dataset

device = os.environ.get("CORPUS_DEVICE", "cuda")
transformers.logging.set_verbosity_error()
torch.manual_seed(0)


class Rows(Dataset):
    def __init__(self, n):
        self.ids = torch.randint(1000, 30000, (n, 128))
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(128, dtype=torch.long),
                "labels": torch.tensor(i % 3)}


cfg = transformers.BertConfig(num_hidden_layers=4, hidden_size=512, num_attention_heads=8,
                              intermediate_size=2048, num_labels=3)
model = transformers.BertForSequenceClassification(cfg)
with tempfile.TemporaryDirectory() as out:
    args = transformers.TrainingArguments(
        output_dir=out, per_device_train_batch_size=16, per_device_eval_batch_size=32,
        max_steps=4, bf16=device == "cuda", use_cpu=device != "cuda", report_to=[],
        save_strategy="no", logging_steps=2, dataloader_num_workers=0, max_grad_norm=1.0)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Rows(64),
                                   eval_dataset=Rows(64))
    trainer.train()
    print(trainer.evaluate())
