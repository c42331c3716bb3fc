"""Tiny Hugging Face checkpoints and transformers' own outputs for them (CPU), for
Vramroom's numerical tests (crates/vramroom-tensor/tests/hf_numerics.rs).

    python3 scripts/hf_fixtures.py            # writes fixtures/hf-numerics/<name>/

For each of gpt2-tiny, llama-tiny, qwen2-tiny and bert-tiny: a config derived from
fixtures/hf/<name>/config.json with smaller sizes (vocabulary, width, MLP, positions: the
corpus configs hold 2-8 MB of float32 weights each) and every switch of the family kept
(grouped-query heads, q/k/v bias, tied embeddings, RoPE theta, activation), the weights
transformers initialises under torch.manual_seed(0) saved with save_pretrained
(model.safetensors; BERT as BertForPreTraining, so the pooler and the MLM head are both
there), and golden.safetensors:
  input_ids        int64 [2, 8]
  logits_float32   causal LM logits / BERT MLM logits, float32 model (use_cache default)
  logits_bfloat16  the same with the model in bfloat16 (values as float32)
  hidden_float32   BERT: BertModel's last_hidden_state; pooler_float32: its pooler_output
  loss_float32     model(input_ids, labels=input_ids).loss (eval mode: no dropout)
  grad.<param>     that loss's gradient of two parameters (first layer's query projection,
                   and the output embedding)
  generated        decoders: greedy generate(max_new_tokens=6, min_new_tokens=6), float32
Versions go to the safetensors metadata.
"""
import json, os, shutil, tempfile

import torch
import transformers as tf
from safetensors.torch import save_file

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SRC = os.path.join(ROOT, "fixtures", "hf")
OUT = os.path.join(ROOT, "fixtures", "hf-numerics")

SHRINK = {
    "gpt2-tiny": dict(n_embd=32, n_head=4, n_layer=2, vocab_size=128, n_positions=64),
    "llama-tiny": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=96, num_hidden_layers=2, vocab_size=128,
                       max_position_embeddings=128),
    "qwen2-tiny": dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                       intermediate_size=96, num_hidden_layers=2, vocab_size=128,
                       max_position_embeddings=128),
    "bert-tiny": dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=2,
                      intermediate_size=64, vocab_size=128, max_position_embeddings=64),
}


GRADS = {
    "gpt2": ["transformer.h.0.attn.c_attn.weight", "transformer.wte.weight"],
    "llama": ["model.layers.0.self_attn.q_proj.weight", "lm_head.weight"],
    "qwen2": ["model.layers.0.self_attn.k_proj.bias", "model.embed_tokens.weight"],
    "bert": ["bert.encoder.layer.0.attention.self.query.weight", "cls.predictions.transform.dense.weight"],
}


def main():
    torch.set_num_threads(1)
    tf.logging.set_verbosity_error()
    for name, shrink in SHRINK.items():
        with open(os.path.join(SRC, name, "config.json")) as f:
            cfg_json = json.load(f)
        cfg_json.update(shrink)
        out = os.path.join(OUT, name)
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "config.json"), "w") as f:
            json.dump(cfg_json, f, indent=2)
            f.write("\n")
        cfg = tf.AutoConfig.from_pretrained(out)
        bert = cfg.model_type == "bert"
        torch.manual_seed(0)
        if bert:
            model = tf.BertForPreTraining(cfg)
        else:
            model = tf.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        model = model.float().eval()
        with tempfile.TemporaryDirectory() as tmp:
            model.save_pretrained(tmp, safe_serialization=True)
            shutil.copy(os.path.join(tmp, "model.safetensors"), os.path.join(out, "model.safetensors"))
        g = torch.Generator().manual_seed(1)
        ids = torch.randint(0, cfg.vocab_size, (2, 8), generator=g)
        gold = {"input_ids": ids}
        with torch.no_grad():
            if bert:
                base = tf.BertModel.from_pretrained(out).eval()
                o = base(input_ids=ids, attention_mask=torch.ones_like(ids))
                gold["hidden_float32"] = o.last_hidden_state.contiguous()
                gold["pooler_float32"] = o.pooler_output.contiguous()
                mlm = tf.BertForMaskedLM.from_pretrained(out).eval()
                with torch.enable_grad():
                    o = mlm(input_ids=ids, labels=ids)
                    o.loss.backward()
                gold["logits_float32"] = o.logits.detach().contiguous()
                gold["loss_float32"] = o.loss.detach().reshape(1)
                params = dict(mlm.named_parameters())
                for n in GRADS["bert"]:
                    gold["grad." + n] = params[n].grad.detach().clone()
                mlm_b = tf.BertForMaskedLM.from_pretrained(out).eval().to(torch.bfloat16)
                gold["logits_bfloat16"] = mlm_b(input_ids=ids).logits.float()
            else:
                m = tf.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
                with torch.enable_grad():
                    o = m(input_ids=ids, labels=ids)
                    o.loss.backward()
                gold["logits_float32"] = o.logits.detach().contiguous()
                gold["loss_float32"] = o.loss.detach().reshape(1)
                params = dict(m.named_parameters())
                for n in GRADS[cfg.model_type]:
                    gold["grad." + n] = params[n].grad.detach().clone()
                gen = m.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                                 max_new_tokens=6, min_new_tokens=6, do_sample=False,
                                 pad_token_id=0)
                gold["generated"] = gen.contiguous()
                mb = tf.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
                gold["logits_bfloat16"] = mb.to(torch.bfloat16)(input_ids=ids).logits.float()
        save_file({k: v.contiguous() for k, v in gold.items()}, os.path.join(out, "golden.safetensors"),
                  metadata={"torch": torch.__version__, "transformers": tf.__version__,
                            "script": "scripts/hf_fixtures.py"})
        sizes = {f: os.path.getsize(os.path.join(out, f)) for f in os.listdir(out)}
        print(name, sizes)


if __name__ == "__main__":
    main()
