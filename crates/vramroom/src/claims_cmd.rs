//! `vramroom claims`: the five well-known claims about PyTorch memory, re-run on
//! Vramroom's runtime, each with a verdict and the measured numbers beside PyTorch's.

use std::process::ExitCode;

use clap::Args;
use vramroom_load::{ClaimVerdict, ClaimsResult};

use crate::error::UserError;

#[derive(Args, Debug)]
pub struct ClaimsArgs {
    /// Print the verdicts as JSON.
    #[arg(long)]
    json: bool,
}

fn fmt_num(v: f64, unit: &str) -> String {
    let s = if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    };
    if unit.is_empty() {
        s
    } else {
        format!("{s} {unit}")
    }
}

/// A table indented under its claim: the first column left-aligned, the rest right.
fn print_indented(header: &[&str], rows: &[Vec<String>]) {
    let mut w: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::from("   ");
        for (i, c) in cells.iter().enumerate() {
            let pad = w[i].saturating_sub(c.chars().count());
            if i == 0 {
                s.push_str(c);
                s.push_str(&" ".repeat(pad));
            } else {
                s.push_str("  ");
                s.push_str(&" ".repeat(pad));
                s.push_str(c);
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    println!(
        "   {}",
        "-".repeat(w.iter().sum::<usize>() + 2 * (w.len() - 1))
    );
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

fn print_claim(i: usize, c: &ClaimVerdict) {
    println!(
        "{}. [{}] {}",
        i + 1,
        if c.holds { "HOLDS" } else { "MYTH" },
        c.claim
    );
    println!("   verdict: {}", c.verdict);
    if !c.numbers.is_empty() {
        let rows: Vec<Vec<String>> = c
            .numbers
            .iter()
            .map(|n| {
                let matches = match n.matches() {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "-",
                };
                vec![
                    n.label.clone(),
                    fmt_num(n.vramroom, &n.unit),
                    n.pytorch
                        .map(|p| fmt_num(p, &n.unit))
                        .unwrap_or_else(|| "-".into()),
                    format!("±{:.0}%", n.tolerance * 100.0),
                    matches.into(),
                ]
            })
            .collect();
        print_indented(
            &[
                "measured",
                "vramroom",
                "pytorch (H200)",
                "tolerance",
                "match",
            ],
            &rows,
        );
    }
    println!(
        "   agrees with PyTorch's measurements: {}",
        if c.matches_pytorch { "yes" } else { "no" }
    );
    println!();
}

pub fn claims(a: ClaimsArgs) -> Result<ExitCode, UserError> {
    let r: ClaimsResult = vramroom_load::claims::run_claims();
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&r).map_err(|e| UserError(e.into()))?
        );
        return Ok(ExitCode::SUCCESS);
    }
    if r.claims.is_empty() {
        println!("no claims were measured");
        return Ok(ExitCode::SUCCESS);
    }
    println!("The well-known claims about PyTorch memory, re-run on Vramroom's runtime:\n");
    for (i, c) in r.claims.iter().enumerate() {
        print_claim(i, c);
    }
    let holds = r.claims.iter().filter(|c| c.holds).count();
    let agree = r.claims.iter().filter(|c| c.matches_pytorch).count();
    println!(
        "{holds} of {} claims hold; {agree} of {} agree with PyTorch's own figures.",
        r.claims.len(),
        r.claims.len()
    );
    Ok(ExitCode::SUCCESS)
}
