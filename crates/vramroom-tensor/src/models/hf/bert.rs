//! transformers 5.17's `BertModel` (encoder with pooler) and `BertForMaskedLM` (encoder and
//! the tied masked-LM head), SDPA attention.
//!
//! Design note: `BertEmbeddings.forward` builds the token-type ids by gathering from a
//! zero buffer ([1, T] int64) and expanding it to [B, T]; the embedding kernel then makes
//! that expanded index contiguous ([B, T] int64, freed after), which is why a BERT forward
//! starts with two int64 allocations. The encoder is bidirectional: no mask for an unpadded
//! batch, no `is_causal`, no cache. Each sub-module's `forward` keeps its input alive until
//! it returns (its caller holds it), and `BertSelfOutput`/`BertOutput` add the residual
//! inside their LayerNorm call. The masked-LM loss is a plain `CrossEntropyLoss` on the
//! logits' dtype (no f32 upcast, unlike the causal-LM loss).

use crate::dtype::DType;
use crate::error::Result;
use crate::ops;
use crate::tensor::Tensor;

use super::config::HfConfig;
use super::error::HfResult;
use super::layers::{self, AttnCall};
use super::masking;
use super::params::{InitKind, Node, ParamStore};

/// Which BERT head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BertHead {
    /// `BertModel` (with the pooler): `AutoModel`, what embedding services load.
    Base,
    /// `BertForMaskedLM`: the encoder without pooler, and the MLM head.
    MaskedLm,
}

struct Lin {
    w: Tensor,
    b: Tensor,
}

impl Lin {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        ops::linear(x, &self.w, Some(&self.b))
    }
}

struct Layer {
    query: Lin,
    key: Lin,
    value: Lin,
    attn_out: Lin,
    attn_ln: Lin,
    inter: Lin,
    out: Lin,
    out_ln: Lin,
}

/// A BERT encoder with one of its heads.
pub struct Bert {
    pub(crate) cfg: HfConfig,
    pub(crate) store: ParamStore,
    pub(crate) training: bool,
    pub head: BertHead,
    word: Tensor,
    position: Tensor,
    token_type: Tensor,
    emb_ln: Lin,
    position_ids: Tensor,
    layers: Vec<Layer>,
    pooler: Option<Lin>,
    /// transform.dense, transform.LayerNorm, decoder (weight tied, bias tied).
    mlm: Option<(Lin, Lin, Lin)>,
}

fn prefix(head: BertHead) -> &'static str {
    match head {
        BertHead::Base => "",
        BertHead::MaskedLm => "bert.",
    }
}

pub(crate) fn tree(c: &HfConfig, head: BertHead) -> Node {
    let (e, std) = (c.hidden_size, c.initializer_range);
    let embeddings = Node::new("embeddings")
        .child(Node::embedding("word_embeddings", c.vocab_size, e, std))
        .child(Node::embedding(
            "position_embeddings",
            c.max_position_embeddings,
            e,
            std,
        ))
        .child(Node::embedding(
            "token_type_embeddings",
            c.type_vocab_size,
            e,
            std,
        ))
        .child(Node::layer_norm("LayerNorm", e))
        .buffer(
            "position_ids",
            &[1, c.max_position_embeddings],
            InitKind::Arange,
            Some(DType::I64),
        )
        .buffer(
            "token_type_ids",
            &[1, c.max_position_embeddings],
            InitKind::Zeros,
            Some(DType::I64),
        );
    let mut layer = Node::new("layer");
    for i in 0..c.num_hidden_layers {
        layer = layer.child(
            Node::new(i.to_string())
                .child(
                    Node::new("attention")
                        .child(
                            Node::new("self")
                                .child(Node::linear("query", e, e, true, std))
                                .child(Node::linear("key", e, e, true, std))
                                .child(Node::linear("value", e, e, true, std)),
                        )
                        .child(
                            Node::new("output")
                                .child(Node::linear("dense", e, e, true, std))
                                .child(Node::layer_norm("LayerNorm", e)),
                        ),
                )
                .child(Node::new("intermediate").child(Node::linear(
                    "dense",
                    e,
                    c.intermediate_size,
                    true,
                    std,
                )))
                .child(
                    Node::new("output")
                        .child(Node::linear("dense", c.intermediate_size, e, true, std))
                        .child(Node::layer_norm("LayerNorm", e)),
                ),
        );
    }
    match head {
        BertHead::Base => Node::new("")
            .child(embeddings)
            .child(Node::new("encoder").child(layer))
            .child(Node::new("pooler").child(Node::linear("dense", e, e, true, std))),
        BertHead::MaskedLm => {
            let bert = Node::new("bert")
                .child(embeddings)
                .child(Node::new("encoder").child(layer));
            let word = "bert.embeddings.word_embeddings.weight";
            let decoder = if c.tie_word_embeddings {
                Node::new("decoder").tied("weight", &[c.vocab_size, e], word)
            } else {
                Node::new("decoder").param("weight", &[c.vocab_size, e], InitKind::Normal(std))
            }
            .tied("bias", &[c.vocab_size], "cls.predictions.bias");
            let predictions = Node::new("predictions")
                .param("bias", &[c.vocab_size], InitKind::Zeros)
                .child(
                    Node::new("transform")
                        .child(Node::linear("dense", e, e, true, std))
                        .child(Node::layer_norm("LayerNorm", e)),
                )
                .child(decoder);
            Node::new("")
                .child(bert)
                .child(Node::new("cls").child(predictions))
        }
    }
}

impl Bert {
    pub(crate) fn new(cfg: HfConfig, store: ParamStore, head: BertHead) -> HfResult<Bert> {
        let p = prefix(head);
        let lin = |n: &str| -> HfResult<Lin> {
            Ok(Lin {
                w: store.get(&format!("{n}.weight"))?,
                b: store.get(&format!("{n}.bias"))?,
            })
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for i in 0..cfg.num_hidden_layers {
            let l = format!("{p}encoder.layer.{i}");
            layers.push(Layer {
                query: lin(&format!("{l}.attention.self.query"))?,
                key: lin(&format!("{l}.attention.self.key"))?,
                value: lin(&format!("{l}.attention.self.value"))?,
                attn_out: lin(&format!("{l}.attention.output.dense"))?,
                attn_ln: lin(&format!("{l}.attention.output.LayerNorm"))?,
                inter: lin(&format!("{l}.intermediate.dense"))?,
                out: lin(&format!("{l}.output.dense"))?,
                out_ln: lin(&format!("{l}.output.LayerNorm"))?,
            });
        }
        let pooler = match head {
            BertHead::Base => Some(lin("pooler.dense")?),
            BertHead::MaskedLm => None,
        };
        let mlm = match head {
            BertHead::Base => None,
            BertHead::MaskedLm => Some((
                lin("cls.predictions.transform.dense")?,
                lin("cls.predictions.transform.LayerNorm")?,
                lin("cls.predictions.decoder")?,
            )),
        };
        Ok(Bert {
            word: store.get(&format!("{p}embeddings.word_embeddings.weight"))?,
            position: store.get(&format!("{p}embeddings.position_embeddings.weight"))?,
            token_type: store.get(&format!("{p}embeddings.token_type_embeddings.weight"))?,
            emb_ln: lin(&format!("{p}embeddings.LayerNorm"))?,
            position_ids: store.get(&format!("{p}embeddings.position_ids"))?,
            layers,
            pooler,
            mlm,
            cfg,
            store,
            head,
            training: false,
        })
    }

    fn ln(&self, x: &Tensor, l: &Lin) -> Result<Tensor> {
        ops::layer_norm(
            x,
            &[self.cfg.hidden_size],
            Some(&l.w),
            Some(&l.b),
            self.cfg.norm_eps,
        )
    }

    fn dropout(&self, x: &Tensor, p: f64) -> Result<Tensor> {
        ops::dropout(x, p, self.training)
    }

    /// `BertEmbeddings.forward` (absolute positions, token type 0).
    fn embeddings(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = (ids.shape()[0], ids.shape()[1]);
        let dev = ids.device();
        // position_ids = self.position_ids[:, :T] (a view of the buffer: allocates nothing)
        let position_ids = self.position_ids.narrow(1, 0, t)?;
        // torch.gather(self.token_type_ids.expand(1, -1), 1, position_ids): [1, T] zeros
        let token_type_ids = Tensor::zeros(&[1, t], DType::I64, dev)?;
        let tt = token_type_ids.expand(&[b, t])?;
        let inputs_embeds = ops::embedding(&self.word, ids)?;
        let token_type_embeddings = ops::embedding(&self.token_type, &tt)?;
        let mut e = inputs_embeds.add(&token_type_embeddings)?;
        let position_embeddings = ops::embedding(&self.position, &position_ids)?;
        e = e.add(&position_embeddings)?;
        e = self.ln(&e, &self.emb_ln)?;
        e = self.dropout(&e, self.cfg.embd_pdrop)?;
        drop((
            position_ids,
            token_type_ids,
            inputs_embeds,
            token_type_embeddings,
            position_embeddings,
        ));
        Ok(e)
    }

    /// `BertLayer.forward` (self-attention, then the feed-forward chunk).
    fn layer(&self, i: usize, x: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let l = &self.layers[i];
        let (b, t) = (x.shape()[0], x.shape()[1]);
        let (nh, d) = (self.cfg.num_attention_heads, self.cfg.head_dim);
        // BertSelfAttention
        let self_out = {
            let heads = |y: Tensor| {
                y.view(&[b as isize, t as isize, -1, d as isize])?
                    .transpose(1, 2)
            };
            let q = heads(l.query.forward(x)?)?;
            let k = heads(l.key.forward(x)?)?;
            let v = heads(l.value.forward(x)?)?;
            let a = layers::sdpa_attention(
                &q,
                &k,
                &v,
                &AttnCall {
                    mask,
                    dropout: if self.training {
                        self.cfg.attn_pdrop
                    } else {
                        0.0
                    },
                    scaling: (d as f64).powf(-0.5),
                    kv_groups: 1,
                    causal: false,
                },
            )?
            .reshape(&[b, t, nh * d])?
            .contiguous()?;
            drop((q, k, v));
            a
        };
        // BertSelfOutput: LayerNorm(dropout(dense(h)) + input_tensor)
        let attention_output = {
            let mut h = l.attn_out.forward(&self_out)?;
            h = self.dropout(&h, self.cfg.resid_pdrop)?;
            // hidden_states = self.LayerNorm(hidden_states + input_tensor): the sum dies
            // after the call, then the rebinding drops the dropout output.
            let out = self.ln(&h.add(x)?, &l.attn_ln)?;
            drop(h);
            out
        };
        drop(self_out);
        // feed_forward_chunk: intermediate (dense + act), output (dense, dropout, LN(+res))
        let intermediate = {
            let h = l.inter.forward(&attention_output)?;
            layers::activation(&h, self.cfg.activation)?
        };
        let layer_output = {
            let mut h = l.out.forward(&intermediate)?;
            h = self.dropout(&h, self.cfg.resid_pdrop)?;
            let out = self.ln(&h.add(&attention_output)?, &l.out_ln)?;
            drop(h);
            out
        };
        drop((intermediate, attention_output));
        Ok(layer_output)
    }

    /// The encoder's last hidden state [B, T, C]; `attention_mask` an all-ones [B, T]
    /// (or none).
    /// `BertModel.forward` keeps `embedding_output` as a local until it returns, so it
    /// outlives the encoder; the caller drops it after the head.
    pub(crate) fn encode(
        &self,
        ids: &Tensor,
        attention_mask: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let embedding_output = self.embeddings(ids)?;
        let mask = masking::bidirectional_mask(attention_mask, ids.device())?;
        let mut h = embedding_output.clone();
        for i in 0..self.layers.len() {
            h = self.layer(i, &h, mask.as_ref())?;
        }
        Ok((h, embedding_output))
    }

    /// `BertModel.forward` → (last_hidden_state, pooler_output); `BertForMaskedLM.forward`
    /// → (logits, loss when `labels`).
    pub(crate) fn forward(
        &self,
        ids: &Tensor,
        attention_mask: Option<&Tensor>,
        labels: Option<&Tensor>,
    ) -> Result<BertOutput> {
        let (h, embedding_output) = self.encode(ids, attention_mask)?;
        if let Some(p) = &self.pooler {
            // first_token_tensor = hidden_states[:, 0]; dense; tanh
            let first = h.select(1, 0)?;
            let pooled = p.forward(&first)?.tanh()?;
            drop((first, embedding_output));
            return Ok(BertOutput {
                last_hidden_state: h,
                pooler_output: Some(pooled),
                logits: None,
                loss: None,
            });
        }
        // `self.bert(...)` returned: its embedding output dies with its frame.
        drop(embedding_output);
        let Some((dense, ln, decoder)) = &self.mlm else {
            return Err(crate::error::TensorError::invalid("bert", "no head"));
        };
        let logits = {
            let mut x = dense.forward(&h)?;
            x = layers::activation(&x, self.cfg.activation)?;
            x = self.ln(&x, ln)?;
            decoder.forward(&x)?
        };
        let loss = match labels {
            Some(l) => {
                let v = self.cfg.vocab_size;
                let flat = logits.reshape(&[logits.numel() / v, v])?;
                Some(ops::cross_entropy(&flat, &l.reshape(&[l.numel()])?)?)
            }
            None => None,
        };
        Ok(BertOutput {
            last_hidden_state: h,
            pooler_output: None,
            logits: Some(logits),
            loss,
        })
    }
}

/// What a BERT forward returns.
pub struct BertOutput {
    pub last_hidden_state: Tensor,
    pub pooler_output: Option<Tensor>,
    /// Masked-LM prediction scores [B, T, V].
    pub logits: Option<Tensor>,
    pub loss: Option<Tensor>,
}
