//! A Hugging Face decoder served with `--new N`: the meta twin runs the same generate the
//! worker runs, so each request's admission price holds its KV cache for prompt + new
//! tokens, and the served answers are the generated tokens.

use std::path::Path;

use vramroom_alloc::AllocatorConfig;
use vramroom_serve::{open_device, BatchKey, Generation, Predictor, ServeDevice, ServedModel};
use vramroom_workload::ModelSpec;

fn spec(name: &str) -> ModelSpec {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/hf")
        .join(name);
    p.display().to_string().parse().unwrap()
}

fn price(spec: &ModelSpec, gen: Generation, key: BatchKey, n: usize) -> u64 {
    let d = open_device(ServeDevice::Cpu, 1 << 30, &AllocatorConfig::default()).unwrap();
    Predictor::with_generation(spec, &d.twin, gen)
        .unwrap()
        .predict(key, n)
        .unwrap()
}

#[test]
fn the_price_of_a_request_holds_its_kv_cache_for_prompt_and_new_tokens() {
    let s = spec("llama-tiny");
    let ModelSpec::Hf(h) = &s else {
        panic!("not a config")
    };
    let c = &h.config;
    let key = BatchKey::Tokens { len: 32 };
    let gen = |new| Generation {
        new_tokens: new,
        use_cache: true,
    };
    let short = price(&s, gen(2), key, 4);
    let long = price(&s, gen(96), key, 4);
    // The last decode step runs on a cache of prompt + 95 positions: 2 (k, v) x layers x
    // batch x kv heads x head_dim, float32 per position; the price (above the weights)
    // holds all of it.
    let kv_per_pos = 2 * c.num_hidden_layers * 4 * c.num_key_value_heads * c.head_dim * 4;
    assert!(
        long >= ((32 + 95) * kv_per_pos) as u64 && long > short,
        "long {long} short {short} kv/pos {kv_per_pos}"
    );
    // And a forward prices the prompt's cache unless use_cache is off.
    let on = price(&s, gen(1), key, 4);
    let off = price(
        &s,
        Generation {
            new_tokens: 1,
            use_cache: false,
        },
        key,
        4,
    );
    assert!(on - off >= (32 * kv_per_pos) as u64, "on {on} off {off}");
}

#[test]
fn served_generate_answers_the_new_tokens() {
    let s = spec("gpt2-tiny");
    let d = open_device(ServeDevice::Cpu, 1 << 30, &AllocatorConfig::default()).unwrap();
    let gen = Generation {
        new_tokens: 5,
        use_cache: true,
    };
    let m = ServedModel::load_with(&s, &d.run.device, gen).unwrap();
    let inp = m.decode_json(br#"{"inputs": [[1, 2, 3, 4]]}"#, 8).unwrap();
    assert_eq!(inp.key, BatchKey::Tokens { len: 4 });
    let out = m.run(inp.key, &[&inp]).unwrap();
    let toks = out[0][0].tokens.as_ref().unwrap();
    assert_eq!(toks.len(), 5);
    assert_eq!(out[0][0].next_token, Some(toks[0] as usize));
}
