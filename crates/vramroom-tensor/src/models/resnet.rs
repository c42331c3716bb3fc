//! torchvision's ResNet (v1.5: stride on the 3x3 conv of the bottleneck), ResNet-18 with
//! `BasicBlock` and ResNet-50 with `Bottleneck`; names `conv1`, `bn1`, `layer1.0.conv1`,
//! `layer2.0.downsample.0`, ..., `fc`.

use crate::error::Result;
use crate::nn::{
    prefixed, AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Init, Linear, MaxPool2d, Module, ReLU,
};
use crate::tensor::Tensor;

pub struct Block {
    pub conv1: Conv2d,
    pub bn1: BatchNorm2d,
    pub conv2: Conv2d,
    pub bn2: BatchNorm2d,
    /// Bottleneck only.
    pub conv3: Option<(Conv2d, BatchNorm2d)>,
    pub downsample: Option<(Conv2d, BatchNorm2d)>,
}

const RELU: ReLU = ReLU { inplace: true };

impl Block {
    /// `out` is reassigned (not shadowed) so each intermediate dies where Python's would.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        // `bn.forward_relu` is `bn` then `relu_`, as torchvision writes it.
        let mut out = self.conv1.forward(x)?;
        out = self.bn1.forward_relu(&out)?;
        out = self.conv2.forward(&out)?;
        if let Some((c3, b3)) = &self.conv3 {
            out = self.bn2.forward_relu(&out)?;
            out = c3.forward(&out)?;
            out = b3.forward(&out)?;
        } else {
            out = self.bn2.forward(&out)?;
        }
        let identity = match &self.downsample {
            Some((c, b)) => b.forward(&c.forward(x)?)?,
            None => x.clone(),
        };
        out.add_(&identity)?;
        drop(identity);
        RELU.forward(out)
    }
}

impl Module for Block {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.walk(|m| m.named_parameters())
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.walk(|m| m.named_buffers())
    }
    fn train(&mut self, on: bool) {
        self.bn1.train(on);
        self.bn2.train(on);
        if let Some((_, b)) = &mut self.conv3 {
            b.train(on);
        }
        if let Some((_, b)) = &mut self.downsample {
            b.train(on);
        }
    }
}

impl Block {
    fn walk(&self, f: impl Fn(&dyn Module) -> Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
        let mut v = prefixed("conv1", f(&self.conv1));
        v.extend(prefixed("bn1", f(&self.bn1)));
        v.extend(prefixed("conv2", f(&self.conv2)));
        v.extend(prefixed("bn2", f(&self.bn2)));
        if let Some((c, b)) = &self.conv3 {
            v.extend(prefixed("conv3", f(c)));
            v.extend(prefixed("bn3", f(b)));
        }
        if let Some((c, b)) = &self.downsample {
            v.extend(prefixed("downsample.0", f(c)));
            v.extend(prefixed("downsample.1", f(b)));
        }
        v
    }
}

pub struct ResNet {
    pub conv1: Conv2d,
    pub bn1: BatchNorm2d,
    pub maxpool: MaxPool2d,
    /// `layers[i][j]` is `layer{i+1}.{j}`.
    pub layers: Vec<Vec<Block>>,
    pub avgpool: AdaptiveAvgPool2d,
    pub fc: Linear,
}

impl ResNet {
    pub fn resnet18(init: &Init, num_classes: usize) -> Result<ResNet> {
        ResNet::new(init, [2, 2, 2, 2], false, num_classes)
    }
    pub fn resnet50(init: &Init, num_classes: usize) -> Result<ResNet> {
        ResNet::new(init, [3, 4, 6, 3], true, num_classes)
    }

    /// Parameters are created in torchvision's order (conv1, bn1, then each block's), so
    /// the allocation sequence of the model matches `torchvision.models.resnet50()`'s.
    pub fn new(
        init: &Init,
        blocks: [usize; 4],
        bottleneck: bool,
        num_classes: usize,
    ) -> Result<ResNet> {
        let expansion = if bottleneck { 4 } else { 1 };
        let conv1 = Conv2d::new(init, 3, 64, 7, 2, 3, false)?;
        let bn1 = BatchNorm2d::new(init, 64)?;
        let mut cin = 64;
        let mut layers = Vec::new();
        for (i, (&n, &w)) in blocks.iter().zip(&[64usize, 128, 256, 512]).enumerate() {
            let mut layer = Vec::new();
            for j in 0..n {
                let stride = if i > 0 && j == 0 { 2 } else { 1 };
                let cout = w * expansion;
                let (conv1, bn1, conv2, bn2, conv3) = if bottleneck {
                    let conv1 = Conv2d::new(init, cin, w, 1, 1, 0, false)?;
                    let bn1 = BatchNorm2d::new(init, w)?;
                    let conv2 = Conv2d::new(init, w, w, 3, stride, 1, false)?;
                    let bn2 = BatchNorm2d::new(init, w)?;
                    let c3 = Conv2d::new(init, w, cout, 1, 1, 0, false)?;
                    let b3 = BatchNorm2d::new(init, cout)?;
                    (conv1, bn1, conv2, bn2, Some((c3, b3)))
                } else {
                    let conv1 = Conv2d::new(init, cin, w, 3, stride, 1, false)?;
                    let bn1 = BatchNorm2d::new(init, w)?;
                    let conv2 = Conv2d::new(init, w, w, 3, 1, 1, false)?;
                    let bn2 = BatchNorm2d::new(init, w)?;
                    (conv1, bn1, conv2, bn2, None)
                };
                // Built after the block's own layers in both kinds, as before (init order).
                let downsample = if j == 0 && (stride != 1 || cin != cout) {
                    Some((
                        Conv2d::new(init, cin, cout, 1, stride, 0, false)?,
                        BatchNorm2d::new(init, cout)?,
                    ))
                } else {
                    None
                };
                let block = Block {
                    conv1,
                    bn1,
                    conv2,
                    bn2,
                    conv3,
                    downsample,
                };
                layer.push(block);
                cin = cout;
            }
            layers.push(layer);
        }
        Ok(ResNet {
            conv1,
            bn1,
            maxpool: MaxPool2d::new(3, 2, 1),
            layers,
            avgpool: AdaptiveAvgPool2d { out: [1, 1] },
            fc: Linear::new(init, 512 * expansion, num_classes, true)?,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let mut x = self.conv1.forward(x)?;
        x = self.bn1.forward_relu(&x)?;
        x = self.maxpool.forward(&x)?;
        // `self.layer1(x)` is an `nn.Sequential`: its input stays referenced by the caller's
        // `x` until the whole layer returns, while inside it `input = module(input)` frees
        // each block's input as soon as the next block has returned.
        for layer in &self.layers {
            let mut h = x.clone();
            for b in layer {
                h = b.forward(&h)?;
            }
            x = h;
        }
        x = self.avgpool.forward(&x)?;
        x = x.flatten(1, -1)?;
        self.fc.forward(&x)
    }

    fn walk(&self, f: impl Fn(&dyn Module) -> Vec<(String, Tensor)>) -> Vec<(String, Tensor)> {
        let mut v = prefixed("conv1", f(&self.conv1));
        v.extend(prefixed("bn1", f(&self.bn1)));
        for (i, layer) in self.layers.iter().enumerate() {
            for (j, b) in layer.iter().enumerate() {
                v.extend(prefixed(&format!("layer{}.{j}", i + 1), f(b)));
            }
        }
        v.extend(prefixed("fc", f(&self.fc)));
        v
    }
}

impl Module for ResNet {
    fn named_parameters(&self) -> Vec<(String, Tensor)> {
        self.walk(|m| m.named_parameters())
    }
    fn named_buffers(&self) -> Vec<(String, Tensor)> {
        self.walk(|m| m.named_buffers())
    }
    fn train(&mut self, on: bool) {
        self.bn1.train(on);
        for layer in &mut self.layers {
            for b in layer {
                b.train(on);
            }
        }
    }
}
