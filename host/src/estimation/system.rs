//! Graphcore's systems by name (`--system`): each sets the IPU generation and the IPUs an
//! estimate fills. How a replica is placed (its pipeline IPUs) is given or found, and the
//! replicas make up the rest:
//!
//! - `replicas` given: each replica takes the system's IPUs over the replicas (an ONNX
//!   model without a placement is split automatically over them);
//! - a placement given (`pipeline_ipus`, `pipeline_stages`, `layers_per_ipu`, the file's
//!   stage attributes, a model file's stages): as many replicas as the system holds of it;
//! - neither (ONNX): the fewest pipeline IPUs, a power of two up to the system's, on which
//!   an automatic split fits with the system's IPUs over them as replicas, as Graphcore's
//!   runs place a model (BERT-Large on a Bow Pod16: four stages of four replicas). More
//!   replicas of fewer stages run faster while they fit: no pipeline ramp, less imbalance.
//!
//! Replicas of a pipeline on IPU counts that are not powers of two take the next power of two
//! each, as Poplar allocates them, and the estimate names the system its IPUs need.

use tessera_sim::machine::Preset;

use super::{EstimateError, EstimateOptions};
use crate::names::Named;

/// A Graphcore system: its IPU generation and how many IPUs it has.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct System {
    /// The IPU generation.
    pub ipu: Preset,
    /// The IPUs it has.
    pub ipus: usize,
}

impl System {
    const fn new(ipu: Preset, ipus: usize) -> Self {
        System { ipu, ipus }
    }

    /// The replicas `replicas` given for this system leave each replica: the IPUs over the
    /// replicas, which must divide them.
    pub fn ipus_per_replica(self, replicas: usize) -> Result<usize, EstimateError> {
        if replicas == 0 || replicas > self.ipus || self.ipus % replicas != 0 {
            return Err(EstimateError::Options(format!(
                "replicas: {replicas} replica(s) do not divide the {} IPUs of system `{}`",
                self.ipus,
                self.name()
            )));
        }
        Ok(self.ipus / replicas)
    }

    /// Checks that a run of `ipus_total` IPUs (replicas x each replica's IPUs, rounded up to
    /// a power of two) fits in the system.
    pub fn check_within(self, ipus_total: usize, replicas: usize) -> Result<(), EstimateError> {
        if ipus_total > self.ipus {
            return Err(EstimateError::Options(format!(
                "system `{}` has {} IPUs: {replicas} replica(s) of this placement take {ipus_total}",
                self.name(),
                self.ipus
            )));
        }
        Ok(())
    }
}

impl Named for System {
    const WHAT: &'static str = "system";
    // vendor: the IPU counts of Graphcore's datasheets (IPU-M2000 and Bow-2000: 4 IPUs; an
    // IPU-POD or Bow Pod N: N IPUs in N / 4 machines; the C600 card: one IPU).
    const NAMES: &'static [(&'static str, Self)] = &[
        ("c600", System::new(Preset::C600, 1)),
        ("ipu-m2000", System::new(Preset::Mk2, 4)),
        ("pod16", System::new(Preset::Mk2, 16)),
        ("pod64", System::new(Preset::Mk2, 64)),
        ("pod128", System::new(Preset::Mk2, 128)),
        ("pod256", System::new(Preset::Mk2, 256)),
        ("bow-2000", System::new(Preset::Bow, 4)),
        ("bow-pod16", System::new(Preset::Bow, 16)),
        ("bow-pod64", System::new(Preset::Bow, 64)),
        ("bow-pod128", System::new(Preset::Bow, 128)),
        ("bow-pod256", System::new(Preset::Bow, 256)),
        ("bow-pod1024", System::new(Preset::Bow, 1024)),
    ];
    const HELP: &'static [&'static str] = &[
        "C600 PCIe card: 1 IPU",
        "IPU-M2000: 4 Mk2 IPUs",
        "IPU-POD16: 16 Mk2 IPUs",
        "IPU-POD64: 64 Mk2 IPUs",
        "IPU-POD128: 128 Mk2 IPUs",
        "IPU-POD256: 256 Mk2 IPUs",
        "Bow-2000: 4 Bow IPUs",
        "Bow Pod16: 16 Bow IPUs",
        "Bow Pod64: 64 Bow IPUs",
        "Bow Pod128: 128 Bow IPUs",
        "Bow Pod256: 256 Bow IPUs",
        "Bow Pod1024: 1024 Bow IPUs",
    ];
}

/// `options` on `system`: its IPU generation, and the replicas checked to divide it. An IPU
/// generation given apart from the system must be the system's (the command line takes one
/// of `--ipu` and `--system`; Python and sweep specs may give both).
pub fn options_for(
    options: &EstimateOptions,
    system: System,
) -> Result<EstimateOptions, EstimateError> {
    if options.ipu != Preset::default() && options.ipu != system.ipu {
        return Err(EstimateError::Options(format!(
            "ipu: `{}` is not the IPU of system `{}` ({}); give one of them",
            options.ipu.name(),
            system.name(),
            system.ipu.name()
        )));
    }
    if let Some(r) = options.replicas {
        system.ipus_per_replica(r)?;
    }
    Ok(EstimateOptions {
        ipu: system.ipu,
        ..options.clone()
    })
}

/// The pipeline IPU counts the search for a placement tries on `system`, fewest first: the
/// powers of two up to its IPUs and `limit`.
pub fn pipeline_candidates(system: System, limit: usize) -> Vec<usize> {
    std::iter::successors(Some(1usize), |&p| p.checked_mul(2))
        .take_while(|&p| p <= system.ipus.min(limit))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_divide_the_system() {
        let pod16 = System::from_name("pod16", false).unwrap();
        assert_eq!(pod16, System::new(Preset::Mk2, 16));
        assert_eq!(pod16.ipus_per_replica(4).unwrap(), 4);
        let e = pod16.ipus_per_replica(3).unwrap_err().to_string();
        assert!(
            e.contains("3 replica(s) do not divide the 16 IPUs of system `pod16`"),
            "{e}"
        );
        assert!(pod16.ipus_per_replica(32).is_err());
        assert!(pod16.check_within(16, 4).is_ok());
        let e = pod16.check_within(32, 4).unwrap_err().to_string();
        assert!(
            e.contains("has 16 IPUs: 4 replica(s) of this placement take 32"),
            "{e}"
        );
    }

    #[test]
    fn candidates_are_powers_of_two_within_the_system() {
        let bow16 = System::from_name("bow-pod16", false).unwrap();
        assert_eq!(pipeline_candidates(bow16, 64), [1, 2, 4, 8, 16]);
        let pod256 = System::from_name("pod256", false).unwrap();
        assert_eq!(pipeline_candidates(pod256, 64).last(), Some(&64));
        let c600 = System::from_name("c600", false).unwrap();
        assert_eq!(pipeline_candidates(c600, 64), [1]);
    }

    #[test]
    fn every_system_has_its_help() {
        assert_eq!(System::NAMES.len(), System::HELP.len());
    }
}
