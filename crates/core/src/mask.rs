//! Which tokens a logits row may pick: `TokenMask`, one bit per token (what a constraint's
//! grammar allows next), and `RowMasks`, the masks of a batch's rows, which host threads may
//! still be computing while a device runs the forward pass: a sampler waits for them only
//! where it needs them (`Backend::sample_rows`).
//!
//! ```text
//!  host threads: Constraint::mask ─► MaskSender::send(row, mask) ─┐
//!  step thread:  forward (queued on the device) ─► sample_rows ─► RowMasks::wait ─► masked chain
//! ```

use crate::{CoreError, Result};
use std::fmt;
use std::sync::mpsc;

/// Allowed tokens: bit `t % 32` of word `t / 32` set = token `t` allowed (the layout of
/// toktrie's `SimpleVob`, which llguidance computes); tokens past the words are not allowed.
#[derive(Clone, PartialEq, Eq)]
pub struct TokenMask {
    words: Vec<u32>,
}

impl fmt::Debug for TokenMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TokenMask({} of {} allowed)", self.count(), 32 * self.words.len())
    }
}

impl TokenMask {
    pub fn from_words(words: Vec<u32>) -> TokenMask {
        TokenMask { words }
    }

    pub fn words(&self) -> &[u32] {
        &self.words
    }

    pub fn allows(&self, id: u32) -> bool {
        self.words.get(id as usize / 32).is_some_and(|w| w >> (id % 32) & 1 == 1)
    }

    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// Set the logits of disallowed tokens to -inf (rows longer than the mask: the extra
    /// entries, which no token of the vocabulary names, too).
    pub fn apply(&self, logits: &mut [f32]) {
        for (i, chunk) in logits.chunks_mut(32).enumerate() {
            let w = self.words.get(i).copied().unwrap_or(0);
            if w == u32::MAX {
                continue;
            }
            for (j, l) in chunk.iter_mut().enumerate() {
                if w >> j & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// The masks of a batch's logits rows (None: the row is unconstrained). Given at once
/// (`ready`) or announced and delivered later from other threads (`pending`): `wait` blocks
/// until every announced mask has come.
pub struct RowMasks {
    masks: Vec<Option<TokenMask>>,
    rx: Option<mpsc::Receiver<(usize, TokenMask)>>,
    /// Announced masks not received yet.
    missing: usize,
}

/// Delivers announced masks to their `RowMasks` (clone it for each thread).
#[derive(Clone)]
pub struct MaskSender(mpsc::Sender<(usize, TokenMask)>);

impl MaskSender {
    /// The mask of logits row `row`. A `RowMasks` already dropped (its step failed) is not
    /// waiting: the mask is discarded.
    pub fn send(&self, row: usize, mask: TokenMask) {
        let _ = self.0.send((row, mask));
    }
}

impl RowMasks {
    /// `rows` unconstrained rows.
    pub fn none(rows: usize) -> RowMasks {
        RowMasks::ready(vec![None; rows])
    }

    pub fn ready(masks: Vec<Option<TokenMask>>) -> RowMasks {
        RowMasks { masks, rx: None, missing: 0 }
    }

    /// `rows` rows of which `masked` get their mask through the returned sender, one
    /// `send` each. If every sender is dropped before all of them came, `wait` fails.
    pub fn pending(rows: usize, masked: usize) -> (MaskSender, RowMasks) {
        let (tx, rx) = mpsc::channel();
        (MaskSender(tx), RowMasks { masks: vec![None; rows], rx: Some(rx), missing: masked })
    }

    pub fn len(&self) -> usize {
        self.masks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.masks.is_empty()
    }

    /// Whether any row is (or will be) masked.
    pub fn any(&self) -> bool {
        self.missing > 0 || self.masks.iter().any(Option::is_some)
    }

    /// Every row's mask, once all announced ones have come.
    pub fn wait(mut self) -> Result<Vec<Option<TokenMask>>> {
        while self.missing > 0 {
            let got = self.rx.as_ref().and_then(|rx| rx.recv().ok());
            let Some((row, mask)) = got else {
                return Err(CoreError::Backend(format!("{} token masks never came (their computation failed)", self.missing)));
            };
            let n = self.masks.len();
            let slot = self.masks.get_mut(row).ok_or_else(|| CoreError::Shape(format!("a mask for row {row} of {n} rows")))?;
            *slot = Some(mask);
            self.missing -= 1;
        }
        Ok(self.masks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mask_sets_disallowed_logits_to_minus_infinity() {
        let m = TokenMask::from_words(vec![0b101, 1]);
        let mut l = vec![1.0; 40];
        m.apply(&mut l);
        let allowed: Vec<usize> = (0..40).filter(|&i| l[i].is_finite()).collect();
        assert_eq!(allowed, vec![0, 2, 32]);
        assert_eq!(m.count(), 3);
        assert!(m.allows(32) && !m.allows(33) && !m.allows(1000));
        // a row longer than the mask: the extra entries are disallowed
        let mut long = vec![0.0; 70];
        m.apply(&mut long);
        assert!(long[64..].iter().all(|v| *v == f32::NEG_INFINITY));
    }

    #[test]
    fn pending_masks_arrive_from_other_threads() {
        let (tx, masks) = RowMasks::pending(4, 2);
        assert!(masks.any());
        std::thread::scope(|s| {
            for row in [3, 1] {
                let tx = tx.clone();
                s.spawn(move || tx.send(row, TokenMask::from_words(vec![row as u32])));
            }
        });
        let got = masks.wait().unwrap();
        assert_eq!(got.iter().map(|m| m.as_ref().map(|m| m.words()[0])).collect::<Vec<_>>(), vec![None, Some(1), None, Some(3)]);
        assert!(!RowMasks::none(3).any());
    }

    #[test]
    fn a_mask_that_never_comes_is_an_error_not_a_hang() {
        let (tx, masks) = RowMasks::pending(2, 2);
        tx.send(0, TokenMask::from_words(vec![1]));
        drop(tx);
        assert!(masks.wait().is_err());
        let (tx, masks) = RowMasks::pending(2, 1);
        tx.send(5, TokenMask::from_words(vec![1]));
        assert!(masks.wait().is_err(), "a row outside the batch");
    }
}
