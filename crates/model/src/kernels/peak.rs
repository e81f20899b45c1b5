//! The rate at which the tier's int8 multiply instruction alone makes byte products: the compute
//! bound of prefill and of many streams, which the benches print beside those figures as the read
//! bandwidth is printed beside decode (issue 52: "the physical bound beside each figure").
//!
//! Why the instruction and not a kernel: a bound must not depend on how well our own kernels are
//! written. Every integer matmul of a tier is built on one multiply instruction (AVX2:
//! `vpmaddubsw`, 32 products a 256-bit instruction; AVX-VNNI: `vpdpbusd` on 256 bits, 32; AVX-512
//! VNNI: `vpdpbusd` on 512 bits, 64), and no kernel of that tier makes products faster than a
//! loop of nothing else. The loop keeps twelve independent chains, more than latency times
//! throughput on any of these cores, so that the pipes, not a chain, set the pace. The figure
//! leaves out everything else a kernel must do (unpacking, widening, scaling), so it bounds from
//! above, and llama.cpp's kernels of the same tier use the same instructions.
#![allow(unsafe_code)]

use super::cpu::{cpu, Avx2Fma, Avx512Vnni, AvxVnni};

/// Products a second of the tier's multiply instruction on `threads` threads at once.
#[derive(Debug, Clone, Copy)]
pub struct Peak {
    /// The instruction measured, as an assembler spells it, with its width.
    pub instruction: &'static str,
    /// u8 x i8 products a second, all threads together.
    pub products_per_sec: f64,
}

const CHAINS: usize = 12;
const ROUNDS: usize = 1 << 20;

/// Measured now, best of five, on the tier this process may use (`TANDEM_CPU`); `None` on the
/// scalar tier, which has no such instruction.
pub fn int8_peak(threads: usize) -> Option<Peak> {
    let c = cpu();
    #[cfg(target_arch = "x86_64")]
    let (instruction, per_call): (&'static str, Box<dyn Fn() + Sync>) = match (c.vnni, c.avxvnni, c.avx2) {
        (Some(t), ..) => ("vpdpbusd zmm", Box::new(move || run_vnni512(t))),
        (None, Some(t), _) => ("vpdpbusd ymm (AVX-VNNI)", Box::new(move || run_avxvnni(t))),
        (None, None, Some(t)) => ("vpmaddubsw ymm", Box::new(move || run_avx2(t))),
        _ => return None,
    };
    #[cfg(not(target_arch = "x86_64"))]
    let (instruction, per_call): (&'static str, Box<dyn Fn() + Sync>) = {
        let _ = c;
        return None;
    };
    let width = if c.vnni.is_some() { 64 } else { 32 };
    let products = (threads * ROUNDS * CHAINS * width) as f64;
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().ok()?;
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = std::time::Instant::now();
        pool.broadcast(|_| per_call());
        best = best.min(start.elapsed().as_secs_f64());
    }
    Some(Peak { instruction, products_per_sec: products / best })
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Avx2Fma, Avx512Vnni, AvxVnni, CHAINS, ROUNDS};
    use std::arch::x86_64::*;
    use std::hint::black_box;

    /// `ROUNDS` rounds of `CHAINS` chained `vpmaddubsw` (each chain feeds its i16 result back as
    /// the next bytes: saturating, meaningless values, and no other instruction in the loop).
    pub fn run_avx2(_: Avx2Fma) {
        // SAFETY: the token proves AVX2.
        unsafe { avx2_loop() }
    }

    #[target_feature(enable = "avx2")]
    unsafe fn avx2_loop() {
        let a = black_box(_mm256_set1_epi8(3));
        let mut x = [black_box(_mm256_set1_epi8(1)); CHAINS];
        for _ in 0..ROUNDS {
            for v in x.iter_mut() {
                *v = _mm256_maddubs_epi16(*v, a);
            }
        }
        black_box(x);
    }

    /// The same with AVX-VNNI's 256-bit `vpdpbusd` (each chain its own accumulator).
    pub fn run_avxvnni(_: AvxVnni) {
        // SAFETY: the token proves AVX2 and AVX-VNNI.
        unsafe { avxvnni_loop() }
    }

    #[target_feature(enable = "avx2,avxvnni")]
    unsafe fn avxvnni_loop() {
        let (w, a) = (black_box(_mm256_set1_epi8(5)), black_box(_mm256_set1_epi8(3)));
        let mut x = [black_box(_mm256_setzero_si256()); CHAINS];
        for _ in 0..ROUNDS {
            for v in x.iter_mut() {
                *v = _mm256_dpbusd_avx_epi32(*v, w, a);
            }
        }
        black_box(x);
    }

    /// The same with AVX-512 VNNI's 512-bit `vpdpbusd`.
    pub fn run_vnni512(_: Avx512Vnni) {
        // SAFETY: the token proves AVX-512 F, BW and VNNI.
        unsafe { vnni512_loop() }
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn vnni512_loop() {
        let (w, a) = (black_box(_mm512_set1_epi8(5)), black_box(_mm512_set1_epi8(3)));
        let mut x = [black_box(_mm512_setzero_si512()); CHAINS];
        for _ in 0..ROUNDS {
            for v in x.iter_mut() {
                *v = _mm512_dpbusd_epi32(*v, w, a);
            }
        }
        black_box(x);
    }
}

#[cfg(target_arch = "x86_64")]
use x86::{run_avx2, run_avxvnni, run_vnni512};

#[cfg(test)]
mod tests {
    #[test]
    fn the_peak_is_measured_where_the_tier_has_an_instruction() {
        match super::int8_peak(1) {
            // Any core of the last fifteen years makes more than a billion products a second
            // with these, and none a trillion on one thread.
            Some(p) => assert!(p.products_per_sec > 1e9 && p.products_per_sec < 1e12, "{p:?}"),
            None => assert_eq!(super::cpu().name(), "scalar"),
        }
    }
}
