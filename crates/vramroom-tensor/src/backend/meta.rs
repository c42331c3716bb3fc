//! The meta backend: every kernel is a no-op.
//!
//! Design note: shapes were checked and memory allocated by the op layer before any kernel
//! runs, so doing nothing here is enough for the allocation sequence to match cpu's exactly.
//! Reading data back from a meta tensor is the one thing that errors.

use super::*;
use crate::error::TensorError;

pub struct MetaBackend;

macro_rules! noop {
    ($($name:ident($($arg:ident : $ty:ty),*);)*) => {
        $(fn $name(&self, $(_: $ty),*) -> Result<()> { Ok(()) })*
    };
}

impl Backend for MetaBackend {
    fn name(&self) -> &'static str {
        "meta"
    }
    fn read_f64(&self, _x: TRef) -> Result<Vec<f64>> {
        Err(TensorError::UnsupportedDevice {
            op: "read data of",
            device: "meta".into(),
        })
    }
    fn attention(&self, _a: &AttentionArgs, _p: &AttentionParams) -> Result<()> {
        Ok(())
    }
    fn attention_backward(&self, _a: &AttentionGradArgs, _p: &AttentionParams) -> Result<()> {
        Ok(())
    }
    noop! {
        fill(a: TRef, b: f64);
        arange(a: TRef, b: f64, c: f64);
        tril_fill(a: TRef, b: f64, c: f64);
        uniform(a: TRef, b: f64, c: f64, d: u64);
        normal(a: TRef, b: f64, c: f64, d: u64);
        write_f64(a: TRef, b: &[f64]);
        copy(a: TRef, b: TRef);
        unary(a: UnaryOp, b: TRef, c: TRef);
        binary(a: BinaryOp, b: TRef, c: TRef, d: TRef);
        reduce(a: ReduceOp, b: TRef, c: &[usize], d: TRef);
        masked_fill(a: TRef, b: TRef, c: f64, d: TRef);
        matmul(a: TRef, b: TRef, c: TRef, d: bool);
        conv2d(a: TRef, b: TRef, c: Option<TRef>, d: TRef, e: &Conv2dParams, f: Workspace);
        conv2d_backward_input(a: TRef, b: TRef, c: TRef, d: &Conv2dParams, e: Workspace);
        conv2d_backward_weight(a: TRef, b: TRef, c: TRef, d: &Conv2dParams, e: Workspace);
        max_pool2d(a: TRef, b: TRef, c: TRef, d: &Pool2dParams);
        max_pool2d_backward(a: TRef, b: TRef, c: TRef);
        adaptive_avg_pool2d(a: TRef, b: TRef);
        adaptive_avg_pool2d_backward(a: TRef, b: TRef);
        batch_norm_train(a: TRef, b: Option<TRef>, c: Option<TRef>, d: Option<TRef>, e: Option<TRef>, f: f64, g: f64, h: TRef, i: TRef, j: TRef);
        batch_norm_eval(a: TRef, b: Option<TRef>, c: Option<TRef>, d: TRef, e: TRef, f: f64, g: TRef);
        batch_norm_backward(a: TRef, b: TRef, c: Option<TRef>, d: TRef, e: TRef, f: bool, f2: f64, g: Option<TRef>, h: Option<TRef>, i: Option<TRef>);
        layer_norm(a: TRef, b: Option<TRef>, c: Option<TRef>, d: f64, e: TRef, f: TRef, g: TRef);
        layer_norm_backward(a: TRef, b: TRef, c: Option<TRef>, d: TRef, e: TRef, f: Option<TRef>, g: Option<TRef>, h: Option<TRef>);
        softmax(a: TRef, b: usize, c: bool, d: TRef);
        softmax_backward(a: TRef, b: TRef, c: usize, d: bool, e: TRef);
        embedding(a: TRef, b: TRef, c: TRef);
        embedding_backward(a: TRef, b: TRef, c: TRef, d: Option<i64>);
        dropout(a: TRef, b: f64, c: u64, d: TRef, e: TRef);
        nll_loss(a: TRef, b: TRef, c: bool, d: i64, e: TRef, f: TRef);
        nll_loss_backward(a: TRef, b: TRef, c: TRef, d: bool, e: i64, f: TRef);
    }
}
