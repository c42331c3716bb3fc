//! `vramroom trace [OPTIONS] -- python train.py ARGS`: the user's own PyTorch program on
//! fake CUDA, no GPU needed, then replayed on Vramroom's allocator.
//!
//! Design note: the tracing happens inside the user's interpreter, because only there do
//! their imports, their venv and their PyTorch exist; that is `python -m vramroom.trace`
//! (python/vramroom/trace/), which records every storage allocation under PyTorch's fake
//! tensors, writes a PyTorch-format snapshot and replays it by calling this binary back
//! (`VRAMROOM_BIN`). So this command stays thin: it checks its flags before anything runs
//! (a bad size or config is exit 2 before the program's first line), finds the interpreter
//! in the command, and runs the tracer in it with the flags forwarded. Without
//! `--alloc-conf`, `PYTORCH_CUDA_ALLOC_CONF` is the program's config, as it would be on the
//! GPU. The tracer's exit status is this command's: 0, 1 for a program that failed, 2 for
//! bad input or an op the tracer cannot model (it names the op).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{anyhow, Context};
use clap::Args;
use vramroom_alloc::size::parse_size;

use crate::error::UserError;
use crate::replay_cmd::{env_alloc_conf, parse_conf_flag, parse_env_conf};
use crate::run_cmd::check_out_file;

#[derive(Args)]
pub struct TraceArgs {
    /// The GPU to trace for: h100 (default), h200, a100, a100-40gb, l4. It sets the
    /// capacity, the hidden allocations (cuBLAS, cuDNN, SDPA's backend) and what
    /// `torch.cuda.get_device_properties` answers.
    #[arg(long, value_name = "NAME", default_value = "h100")]
    gpu: String,
    /// GPU capacity for the OOM verdict, e.g. 24GiB. Default: the GPU's memory less the
    /// CUDA context.
    #[arg(long, value_name = "SIZE")]
    capacity: Option<String>,
    /// Allocator config to replay under, PYTORCH_CUDA_ALLOC_CONF syntax. Default:
    /// $PYTORCH_CUDA_ALLOC_CONF when set, else PyTorch's default.
    #[arg(long = "alloc-conf", value_name = "CONF")]
    alloc_conf: Option<String>,
    /// Another config to compare, a row each (repeatable).
    #[arg(long = "what-if", value_name = "CONF")]
    what_if: Vec<String>,
    /// Keep the traced snapshot here (PyTorch's format: `vramroom replay`, `diff` and
    /// pytorch.org/memory_viz open it).
    #[arg(long = "snapshot-out", value_name = "PATH")]
    snapshot_out: Option<PathBuf>,
    /// Print the report as JSON on stdout, after the program's own output.
    #[arg(long)]
    json: bool,
    /// The program: `python train.py ARGS` (or `train.py ARGS`, run with python3).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    command: Vec<String>,
}

pub fn trace(a: TraceArgs) -> Result<ExitCode, UserError> {
    if let Some(c) = &a.capacity {
        let v = parse_size(c).with_context(|| format!("bad --capacity '{c}'"))?;
        if v == 0 {
            return Err(anyhow!("--capacity must be above zero").into());
        }
    }
    let env_conf = env_alloc_conf(a.alloc_conf.is_some());
    if let Some(c) = &a.alloc_conf {
        parse_conf_flag("--alloc-conf", c)?;
    } else if let Some(e) = &env_conf {
        parse_env_conf(e)?;
    }
    for c in &a.what_if {
        parse_conf_flag("--what-if", c)?;
    }
    let conf = a.alloc_conf.clone().or(env_conf);
    if let Some(p) = &a.snapshot_out {
        check_out_file("--snapshot-out", p)?;
    }
    let (python, script, rest) = split_command(&a.command)?;
    let mut cmd = Command::new(&python);
    cmd.args(["-m", "vramroom.trace", "--gpu", &a.gpu]);
    if let Some(c) = &a.capacity {
        cmd.args(["--capacity", c]);
    }
    if let Some(c) = &conf {
        cmd.args(["--alloc-conf", c]);
    }
    for c in &a.what_if {
        cmd.args(["--what-if", c]);
    }
    if let Some(p) = &a.snapshot_out {
        cmd.arg("--snapshot-out").arg(p);
    }
    if a.json {
        cmd.arg("--json");
    }
    cmd.arg("--").arg(&script).args(rest);
    if let Ok(me) = std::env::current_exe() {
        cmd.env("VRAMROOM_BIN", me);
    }
    let status = cmd.status().map_err(|e| {
        anyhow!("cannot run {python}: {e} (vramroom trace runs the tracer in that interpreter)")
    })?;
    match status.code() {
        Some(0) => Ok(ExitCode::SUCCESS),
        Some(code) => Ok(ExitCode::from(code.clamp(1, 255) as u8)),
        // Killed by a signal: the program did not finish.
        None => Ok(ExitCode::from(1)),
    }
}

/// The interpreter, the script and its arguments, from `python train.py ARGS` or
/// `train.py ARGS`. A command that is not a Python script is refused (exit 2) before
/// anything runs, since only a Python program can be traced.
fn split_command(c: &[String]) -> Result<(String, String, &[String]), UserError> {
    let first = c.first().ok_or_else(|| anyhow!("no command after --"))?;
    let is_python = |s: &str| {
        let name = Path::new(s)
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("");
        name == "python" || name.starts_with("python3") || name == "python2"
    };
    let (python, at) = if first.ends_with(".py") {
        ("python3".to_string(), 0)
    } else if is_python(first) {
        (first.clone(), 1)
    } else {
        return Err(anyhow!(
            "vramroom trace runs a Python program: `-- python train.py ARGS`, not `{first}`"
        )
        .into());
    };
    let script = c
        .get(at)
        .ok_or_else(|| anyhow!("no script after {python}"))?;
    if script.starts_with('-') {
        return Err(anyhow!(
            "vramroom trace runs a script file (`-- python train.py ARGS`); interpreter flags \
             such as `{script}` are not supported"
        )
        .into());
    }
    if !Path::new(script).is_file() {
        return Err(anyhow!("no such script: {script}").into());
    }
    Ok((python, script.clone(), &c[at + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn the_interpreter_and_script_are_found_or_refused() {
        let dir = std::env::temp_dir().join(format!("vramroom-trace-cmd-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("train.py");
        std::fs::write(&script, "print(1)\n").unwrap();
        let s = script.to_str().unwrap();
        let c = v(&["/usr/bin/python3.11", s, "--batch", "8"]);
        let Ok((py, sc, rest)) = split_command(&c) else {
            panic!("a python command was refused")
        };
        assert_eq!((py.as_str(), sc.as_str()), ("/usr/bin/python3.11", s));
        assert_eq!(rest, &v(&["--batch", "8"])[..]);
        let c = v(&[s]);
        assert!(matches!(split_command(&c), Ok((py, _, _)) if py == "python3"));
        assert!(split_command(&v(&["torchrun", s])).is_err());
        assert!(split_command(&v(&["python", "-m", "pkg"])).is_err());
        assert!(split_command(&v(&["python", "missing.py"])).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
