//! The CPU's SIMD features, detected once per process, as tokens.
//!
//! A token (`Avx2Fma`, `AvxVnni`, `Avx512F`, `Avx512Vnni`) can only be obtained from [`cpu`], and only when
//! the feature is there; the `unsafe` SIMD functions take one as an argument, so none can be
//! called without the detection having succeeded. What remains for each caller to guarantee is
//! stated in the function's `# Safety` section (slice lengths), and the safe dispatch functions
//! check it with an `assert!` before the call.

use std::sync::OnceLock;

/// Proof that the CPU runs AVX2, FMA and F16C.
#[derive(Debug, Clone, Copy)]
pub struct Avx2Fma(());

/// Proof that the CPU runs AVX2, FMA, F16C and AVX-VNNI: the 256-bit, VEX-encoded `vpdpbusd` of
/// Intel's chips since Alder Lake (laptops and desktops without AVX-512) and AMD's since Zen 5.
#[derive(Debug, Clone, Copy)]
pub struct AvxVnni(());

impl AvxVnni {
    /// AVX-VNNI implies the AVX2 tier's features (it is only detected with them).
    pub fn avx2(self) -> Avx2Fma {
        Avx2Fma(())
    }
}

/// Proof that the CPU runs AVX-512F.
#[derive(Debug, Clone, Copy)]
pub struct Avx512F(());

/// Proof that the CPU runs AVX-512 F, BW and VNNI.
#[derive(Debug, Clone, Copy)]
pub struct Avx512Vnni(());

/// The features this process may use.
#[derive(Debug, Clone, Copy)]
pub struct Cpu {
    pub avx2: Option<Avx2Fma>,
    pub avxvnni: Option<AvxVnni>,
    pub avx512f: Option<Avx512F>,
    pub vnni: Option<Avx512Vnni>,
}

/// The highest kernel tier a process may use (`TANDEM_CPU`, `--cpu`): each tier runs on any CPU
/// that has it, so one machine with AVX-512 can test and measure the AVX2 and scalar kernels that
/// most users' CPUs run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// Everything detected (AVX-512 F, and VNNI where present).
    Avx512,
    /// AVX2 with AVX-VNNI's byte dot product, as on Intel's laptop and desktop chips since
    /// Alder Lake.
    AvxVnni,
    /// AVX2, FMA and F16C only, as on every AMD before Zen 4 and Intel's chips before Alder Lake.
    Avx2,
    /// No SIMD tokens: the portable Rust loops.
    Scalar,
}

impl Tier {
    pub fn parse(s: &str) -> Option<Tier> {
        match s {
            "avx512" => Some(Tier::Avx512),
            "avxvnni" => Some(Tier::AvxVnni),
            "avx2" => Some(Tier::Avx2),
            "scalar" => Some(Tier::Scalar),
            _ => None,
        }
    }
}

impl Cpu {
    /// These features, without those above `tier`.
    pub fn capped(self, tier: Tier) -> Cpu {
        match tier {
            Tier::Avx512 => self,
            Tier::AvxVnni => Cpu { avx512f: None, vnni: None, ..self },
            Tier::Avx2 => Cpu { avxvnni: None, avx512f: None, vnni: None, ..self },
            Tier::Scalar => Cpu { avx2: None, avxvnni: None, avx512f: None, vnni: None },
        }
    }

    /// The tier these features make up, as [`Tier::parse`] spells it, with VNNI named.
    pub fn name(&self) -> &'static str {
        match (self.vnni, self.avx512f, self.avxvnni, self.avx2) {
            (Some(_), ..) => "avx512-vnni",
            (None, Some(_), ..) => "avx512",
            (None, None, Some(_), _) => "avxvnni",
            (None, None, None, Some(_)) => "avx2",
            _ => "scalar",
        }
    }
}

static CPU: OnceLock<Cpu> = OnceLock::new();

/// Detected on first use (capped by `TANDEM_CPU` when it names a tier), then read from memory
/// (the detection macro caches too, but one load of a struct is cheaper than three of its atomics
/// on every matmul row).
pub fn cpu() -> &'static Cpu {
    CPU.get_or_init(|| {
        let tier = std::env::var("TANDEM_CPU").ok().and_then(|v| Tier::parse(&v));
        detect().capped(tier.unwrap_or(Tier::Avx512))
    })
}

/// Caps the kernels at `tier` for the rest of the process (the server's `--cpu`, before the model
/// loads). Refused once a kernel has run: the tier cannot change under a running model.
pub fn limit(tier: Tier) -> Result<&'static Cpu, String> {
    let capped = detect().capped(tier);
    let now = CPU.get_or_init(|| capped);
    if now.name() != capped.name() {
        return Err(format!("the kernels already run at tier {}", now.name()));
    }
    Ok(now)
}

/// Whether the CPU is Intel's (CPUID's vendor string), for the few choices that measured
/// differently on Intel's and AMD's cores (`blocks_tile::keeps`).
pub fn intel() -> bool {
    static INTEL: OnceLock<bool> = OnceLock::new();
    *INTEL.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            // SAFETY: CPUID leaf 0 exists on every x86-64 CPU.
            #[allow(unused_unsafe)]
            let id = unsafe { std::arch::x86_64::__cpuid(0) };
            // "GenuineIntel", in EBX, EDX, ECX.
            (id.ebx, id.edx, id.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e)
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    })
}

#[cfg(target_arch = "x86_64")]
fn detect() -> Cpu {
    use std::is_x86_feature_detected as has;
    Cpu {
        // Every AVX2 CPU has F16C; the attention kernels widen f16 keys and values with it.
        avx2: (has!("avx2") && has!("fma") && has!("f16c")).then_some(Avx2Fma(())),
        avxvnni: (has!("avx2") && has!("fma") && has!("f16c") && has!("avxvnni")).then_some(AvxVnni(())),
        avx512f: has!("avx512f").then_some(Avx512F(())),
        vnni: (has!("avx512f") && has!("avx512bw") && has!("avx512vnni")).then_some(Avx512Vnni(())),
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn detect() -> Cpu {
    Cpu { avx2: None, avxvnni: None, avx512f: None, vnni: None }
}

/// An output buffer that parallel tasks write disjoint elements of, through a raw pointer (the
/// one such type of the kernels: the matmul tasks and the training attention's tasks use it).
/// Whoever builds one keeps the `&mut` borrow of the buffer until every task has finished.
#[derive(Clone, Copy)]
pub(crate) struct SharedOut(*mut f32);

// SAFETY: the tasks sharing it write disjoint elements (each user says how), and the buffer
// outlives them (the `&mut` borrow is held across the parallel section).
unsafe impl Send for SharedOut {}
unsafe impl Sync for SharedOut {}

impl SharedOut {
    pub fn new(out: &mut [f32]) -> Self {
        SharedOut(out.as_mut_ptr())
    }

    /// The pointer (a method, so that closures capture the whole `SharedOut`, which is `Sync`).
    #[inline(always)]
    pub fn ptr(&self) -> *mut f32 {
        self.0
    }
}
