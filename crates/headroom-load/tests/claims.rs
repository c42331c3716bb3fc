//! `headroom claims`: every claim of ground-truth.md is busted on Headroom's runtime as on
//! PyTorch's, with Headroom's figures within tolerance of PyTorch's.

#[test]
fn five_claims_match_pytorch() {
    let r = headroom_load::claims::run_claims();
    assert_eq!(r.claims.len(), 5);
    for c in &r.claims {
        eprintln!(
            "{}: holds={} matches={} — {}",
            c.id, c.holds, c.matches_pytorch, c.verdict
        );
        assert!(!c.numbers.is_empty(), "{}: {}", c.id, c.verdict);
        // All five are myths, on PyTorch and here.
        assert!(!c.holds, "{}: {}", c.id, c.verdict);
        assert!(c.matches_pytorch, "{}: {:#?}", c.id, c.numbers);
    }
    let json = serde_json::to_string(&r).unwrap();
    let back: headroom_load::ClaimsResult = serde_json::from_str(&json).unwrap();
    assert_eq!(back.claims.len(), 5);
}

#[test]
fn concurrency_model_matches_pytorch_threads() {
    let v = headroom_load::claims::concurrency_vs_pytorch();
    for n in &v.numbers {
        eprintln!("{}: {:.1} (PyTorch {:?})", n.label, n.headroom, n.pytorch);
    }
    assert_eq!(v.numbers.len(), 10);
    assert!(v.matches_pytorch, "{:#?}", v.numbers);
}
