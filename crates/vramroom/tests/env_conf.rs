//! PYTORCH_CUDA_ALLOC_CONF from the environment: the default config, said on stderr; the
//! flag wins.

use std::path::PathBuf;
use std::process::Command;

fn trace(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/traces")
        .join(name)
}

fn run(args: &[&str], env: Option<&str>) -> (i32, String, String) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_vramroom"));
    c.args(args);
    match env {
        Some(v) => c.env("PYTORCH_CUDA_ALLOC_CONF", v),
        None => c.env_remove("PYTORCH_CUDA_ALLOC_CONF"),
    };
    let out = c.output().expect("run vramroom");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

const CONF: &str = "expandable_segments:True";

#[test]
fn replay_uses_the_environment_config_and_says_so() {
    let t = trace("resnet50_train_sgd__default.pickle");
    let t = t.to_str().unwrap();
    let (code, from_env, err) = run(&["replay", t, "--json"], Some(CONF));
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"),
        "{err}"
    );
    let (_, from_flag, flag_err) = run(&["replay", t, "--json", "--alloc-conf", CONF], None);
    assert_eq!(from_env, from_flag);
    assert!(!flag_err.contains("PYTORCH_CUDA_ALLOC_CONF"));
    // Without either: the snapshot's own config, which reserves differently.
    let (_, own, _) = run(&["replay", t, "--json"], None);
    assert_ne!(own, from_env);
    // The flag wins over the environment, silently.
    let (_, both, both_err) = run(
        &["replay", t, "--json", "--alloc-conf", "default"],
        Some(CONF),
    );
    assert_eq!(
        both,
        run(&["replay", t, "--json", "--alloc-conf", "default"], None).1
    );
    assert!(!both_err.contains("PYTORCH_CUDA_ALLOC_CONF"), "{both_err}");
    // An empty variable is no config.
    let (_, empty, empty_err) = run(&["replay", t, "--json"], Some(""));
    assert_eq!(empty, own);
    assert!(!empty_err.contains("PYTORCH_CUDA_ALLOC_CONF"));
}

#[test]
fn summary_and_predict_use_it_too() {
    let t = trace("resnet50_train_sgd__default.pickle");
    let t = t.to_str().unwrap();
    let (code, env_sum, err) = run(&["summary", t], Some(CONF));
    assert_eq!(code, 0, "{err}");
    assert_eq!(env_sum, run(&["summary", t, "--alloc-conf", CONF], None).1);
    let p = ["predict", "--model", "mlp", "--batch", "4", "--json"];
    let (code, env_p, err) = run(&p, Some("max_split_size_mb:20"));
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("PYTORCH_CUDA_ALLOC_CONF"), "{err}");
    let mut flag = p.to_vec();
    flag.extend(["--alloc-conf", "max_split_size_mb:20"]);
    assert_eq!(env_p, run(&flag, None).1);
}

#[test]
fn a_bad_environment_config_is_named_and_exits_2() {
    let t = trace("resnet50_infer_nograd__default.pickle");
    for args in [
        vec!["replay", t.to_str().unwrap()],
        vec!["predict", "--model", "mlp"],
    ] {
        let (code, _, err) = run(&args, Some("bogus_knob:1"));
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains("bad PYTORCH_CUDA_ALLOC_CONF"), "{err}");
    }
}
