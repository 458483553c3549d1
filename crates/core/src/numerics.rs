//! The arithmetic a backend uses where several orders of summation are possible.

/// How a backend sums where it has a choice of float orders.
///
/// The CPU backend always follows llama.cpp's CPU order; the CUDA backend offers the three.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Numerics {
    /// The fastest kernels: a prompt's matmuls and decode's sum in different float orders, so a
    /// prompt and its tokens one by one can differ by roundings.
    #[default]
    Fast,
    /// Batch-invariant at prompt speed: every matmul in one float order at every token count,
    /// so prefill and decode (and any batch) give the same bits.
    Invariant,
    /// Batch-invariant and, where the device can reproduce it, the CPU backend's float order
    /// (slower prompts).
    Exact,
}

impl Numerics {
    pub const ALL: [Numerics; 3] = [Numerics::Fast, Numerics::Invariant, Numerics::Exact];

    pub fn as_str(self) -> &'static str {
        match self {
            Numerics::Fast => "fast",
            Numerics::Invariant => "invariant",
            Numerics::Exact => "exact",
        }
    }

    /// The default for a model: invariant where a rounding difference between a prompt and its
    /// tokens one by one would be carried into different expert choices (routed experts) or
    /// recurrent states (Mamba2 layers), fast otherwise.
    pub fn for_model(routed_experts: bool, recurrent_state: bool) -> Numerics {
        if routed_experts || recurrent_state {
            Numerics::Invariant
        } else {
            Numerics::Fast
        }
    }

    /// Whether prefill and decode give the same bits.
    pub fn batch_invariant(self) -> bool {
        self != Numerics::Fast
    }
}

impl std::fmt::Display for Numerics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Numerics {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Numerics::ALL
            .into_iter()
            .find(|n| n.as_str().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown numerics {s:?} (fast, invariant or exact)"))
    }
}

#[cfg(test)]
mod tests {
    use super::Numerics;

    #[test]
    fn names_round_trip_and_models_choose() {
        for n in Numerics::ALL {
            assert_eq!(n.as_str().parse::<Numerics>().unwrap(), n);
        }
        assert!("approximate".parse::<Numerics>().is_err());
        assert_eq!(Numerics::for_model(false, false), Numerics::Fast);
        assert_eq!(Numerics::for_model(true, false), Numerics::Invariant);
        assert_eq!(Numerics::for_model(false, true), Numerics::Invariant);
        assert!(!Numerics::Fast.batch_invariant() && Numerics::Exact.batch_invariant());
    }
}
