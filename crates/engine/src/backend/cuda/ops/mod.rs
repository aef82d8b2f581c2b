//! The kernels' host side: one file per `.cu` file of `kernels/` (common.cu has no entry
//! points), each with its [`kernels!`] table, and beside it the host launchers of its kernels
//! (`gemv.rs`: linears; `attention.rs`: KV cache and attention; `moe.rs`: experts; the kernels
//! of `prefill.rs`, `elementwise.rs` and `sampling.rs` are launched from `gemv.rs`,
//! `attention.rs`, the backend's ops in `../mod.rs` and the fused step in `../decode.rs`).
//!
//! A table names every entry point (or its variants) and its typed parameter list, once. It
//! generates the file's function table (`Funcs`, loaded by [`Funcs::load`]), the names the
//! backend loads and the NVRTC check looks for ([`kernel_names`]), and one argument struct per
//! kernel whose `launch` pushes the fields, in order, as the kernel's parameters: a launch site
//! names every argument, and a device pointer is a [`DevPtr`] of the element type the kernel
//! reads.

use std::marker::PhantomData;

use cudarc::driver::{CudaFunction, DeviceRepr};

use crate::error::Result;

/// A device address of `T` values (the kernel's `T*` or `const T*`; `u8` for `void*` and byte
/// buffers, `u16` for bf16). Passed to a kernel as the bare 64-bit address.
#[repr(transparent)]
pub(crate) struct DevPtr<T>(u64, PhantomData<fn() -> T>);

impl<T> Clone for DevPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for DevPtr<T> {}

impl<T> Default for DevPtr<T> {
    fn default() -> Self {
        Self::NULL
    }
}

impl<T> std::fmt::Debug for DevPtr<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DevPtr({:#x})", self.0)
    }
}

impl<T> DevPtr<T> {
    /// The null pointer (a kernel's "none" for optional operands).
    pub(crate) const NULL: Self = Self(0, PhantomData);

    /// The pointer at device address `addr`.
    pub(crate) const fn new(addr: u64) -> Self {
        Self(addr, PhantomData)
    }

    /// Whether the address is a multiple of `n` bytes.
    pub(crate) const fn aligned(self, n: u64) -> bool {
        self.0.is_multiple_of(n)
    }

    /// The device address.
    pub(crate) const fn addr(self) -> u64 {
        self.0
    }

    /// Whether this is the null pointer.
    pub(crate) const fn is_null(self) -> bool {
        self.0 == 0
    }

    /// The pointer `n` values of `T` further.
    pub(crate) const fn add(self, n: usize) -> Self {
        Self(self.0 + (n * std::mem::size_of::<T>()) as u64, PhantomData)
    }

    /// The same address as a pointer to `U` (a kernel reading the bytes as another type).
    pub(crate) const fn cast<U>(self) -> DevPtr<U> {
        DevPtr(self.0, PhantomData)
    }
}

// SAFETY: a transparent 64-bit device address, what the kernels take for a pointer parameter.
unsafe impl<T: 'static> DeviceRepr for DevPtr<T> {}

/// The function tables of all kernel files, loaded from one compiled module.
pub(crate) struct Funcs {
    pub gemv: gemv::Funcs,
    pub prefill: prefill::Funcs,
    pub elementwise: elementwise::Funcs,
    pub attention: attention::Funcs,
    pub moe: moe::Funcs,
    pub sampling: sampling::Funcs,
}

impl Funcs {
    /// Every kernel of every table, each looked up by `get`.
    pub(crate) fn load(get: &mut impl FnMut(&str) -> Result<CudaFunction>) -> Result<Self> {
        Ok(Self {
            gemv: gemv::Funcs::load(get)?,
            prefill: prefill::Funcs::load(get)?,
            elementwise: elementwise::Funcs::load(get)?,
            attention: attention::Funcs::load(get)?,
            moe: moe::Funcs::load(get)?,
            sampling: sampling::Funcs::load(get)?,
        })
    }
}

/// The names of every kernel entry point the backend loads (each table's `NAMES`).
pub(crate) fn kernel_names() -> Vec<&'static str> {
    [
        gemv::NAMES,
        prefill::NAMES,
        elementwise::NAMES,
        attention::NAMES,
        moe::NAMES,
        sampling::NAMES,
    ]
    .concat()
    .concat()
}

/// A table of kernels of one `.cu` file (`group`: its field in [`Funcs`]). Each entry:
///
/// ```text
/// /// doc
/// name => NameArgs { param: Type, ... }                  // entry point `name`
/// name ["variant_a", "variant_b"] => NameArgs { ... }    // variants of one signature
/// name shared BYTES => NameArgs { ... }                  // BYTES of dynamic shared memory
/// ```
///
/// with the parameters exactly as the kernel declares them (`int` → `i32`, `long` → `i64`,
/// `float` → `f32`, `double` → `f64`, `T*` → `DevPtr<T>`, structs by value as their `#[repr(C)]`
/// twins). Generates `Funcs` (one `Vec<CudaFunction>` per entry, its variants in order), `NAMES`
/// (per entry) and the argument structs with `launch(self, backend, [variant,] grid, block)`.
macro_rules! kernels {
    (@names $f:ident) => { &[stringify!($f)] };
    (@names $f:ident [$($v:literal),+]) => { &[$($v),+] };
    (@launch $group:ident $f:ident) => { kernels!(@launch $group $f; 0); };
    (@launch $group:ident $f:ident; $smem:expr) => {
        /// Launches the kernel on `b`'s stream: `grid` blocks of `block` threads, with the
        /// dynamic shared memory its table entry declares, if any (above 48 KiB the backend
        /// raised the kernel's limit when it loaded it).
        pub(crate) fn launch(
            self,
            b: &$crate::backend::cuda::CudaBackend,
            grid: (u32, u32, u32),
            block: (u32, u32, u32),
        ) -> $crate::error::Result<()> {
            self.launch_on(b, &b.inner.f.$group.$f[0], grid, block, $smem)
        }
    };
    (@launch $group:ident $f:ident [$($v:literal),+]) => {
        kernels!(@launch $group $f [$($v),+]; 0);
    };
    (@launch $group:ident $f:ident [$($v:literal),+]; $smem:expr) => {
        /// Launches variant `variant` (its place in the table's list) on `b`'s stream: `grid`
        /// blocks of `block` threads, with the dynamic shared memory the entry declares, if any.
        pub(crate) fn launch(
            self,
            b: &$crate::backend::cuda::CudaBackend,
            variant: usize,
            grid: (u32, u32, u32),
            block: (u32, u32, u32),
        ) -> $crate::error::Result<()> {
            let f = b.inner.f.$group.$f.get(variant).ok_or_else(|| {
                b.err(format!("kernel {}: no variant {variant}", stringify!($f)))
            })?;
            self.launch_on(b, f, grid, block, $smem)
        }
    };
    (
        group $group:ident;
        $(
            $(#[$doc:meta])*
            $f:ident $([$($v:literal),+ $(,)?])? $(shared $smem:expr)? => $args:ident { $($p:ident : $t:ty),* $(,)? }
        )*
    ) => {
        /// The kernels of this file, as loaded (each entry's variants in the table's order).
        pub(crate) struct Funcs {
            $( pub(crate) $f: Vec<::cudarc::driver::CudaFunction>, )*
        }

        /// The entry points of this file, per table entry.
        pub(crate) const NAMES: &[&[&str]] = &[ $( kernels!(@names $f $([$($v),+])?) ),* ];

        /// Each entry's entry points and its parameter types as the table writes them (the
        /// check of the table against the `.cu` declarations).
        #[cfg(test)]
        pub(crate) const SIGNATURES: &[(&[&str], &[&str])] = &[
            $( (kernels!(@names $f $([$($v),+])?), &[ $( stringify!($t) ),* ]) ),*
        ];

        impl Funcs {
            /// Looks every entry point of this file up with `get`.
            pub(crate) fn load(
                get: &mut impl FnMut(&str) -> $crate::error::Result<::cudarc::driver::CudaFunction>,
            ) -> $crate::error::Result<Self> {
                Ok(Self {
                    $( $f: {
                        let names: &[&str] = kernels!(@names $f $([$($v),+])?);
                        names.iter().map(|n| get(n)).collect::<$crate::error::Result<_>>()?
                    }, )*
                })
            }
        }

        $(
            $(#[$doc])*
            #[derive(Clone, Copy)]
            pub(crate) struct $args {
                $( pub(crate) $p: $t, )*
            }

            impl $args {
                kernels!(@launch $group $f $([$($v),+])? $(; $smem)?);

                /// Launches `f` with these arguments, in the order of the kernel's parameters,
                /// and `smem` bytes of dynamic shared memory.
                fn launch_on(
                    self,
                    b: &$crate::backend::cuda::CudaBackend,
                    f: &::cudarc::driver::CudaFunction,
                    grid: (u32, u32, u32),
                    block: (u32, u32, u32),
                    smem: u32,
                ) -> $crate::error::Result<()> {
                    let Self { $($p),* } = self;
                    let cfg = ::cudarc::driver::LaunchConfig {
                        grid_dim: grid,
                        block_dim: block,
                        shared_mem_bytes: smem,
                    };
                    if b.inner.pdl {
                        // one pointer per parameter, to the value of the parameter's type
                        let mut params = [
                            $( &$p as *const $t as *mut ::core::ffi::c_void, )*
                        ];
                        // SAFETY: the fields are the kernel's parameters in order and type (the
                        // table), alive until the launch returns.
                        unsafe { b.launch_pdl(f, cfg, &mut params) }
                    } else {
                        let mut lb = b.inner.stream.launch_builder(f);
                        $( ::cudarc::driver::PushKernelArg::arg(&mut lb, &$p); )*
                        // SAFETY: the fields are the kernel's parameters in order and type.
                        unsafe { lb.launch(cfg) }
                            .map(|_| ())
                            .map_err(|e| b.err(format!("launch: {e:?}")))
                    }
                }
            }
        )*
    };
}

// (after the macro: the tables use it)
pub(crate) mod attention;
pub(crate) mod elementwise;
pub(crate) mod gemv;
pub(crate) mod moe;
pub(crate) mod prefill;
pub(crate) mod sampling;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::cuda::KERNELS_CU;

    /// Every table's entries with their parameter types.
    fn table() -> Vec<(&'static [&'static str], &'static [&'static str])> {
        [
            gemv::SIGNATURES,
            prefill::SIGNATURES,
            elementwise::SIGNATURES,
            attention::SIGNATURES,
            moe::SIGNATURES,
            sampling::SIGNATURES,
        ]
        .concat()
    }

    /// Replaces the identifiers of `text` that are keys of `map`.
    fn substitute(text: &str, map: &[(String, String)]) -> String {
        let mut out = String::new();
        let mut word = String::new();
        let flush = |word: &mut String, out: &mut String| {
            let w = map
                .iter()
                .find(|(k, _)| k == word)
                .map_or(word.as_str(), |(_, v)| v);
            out.push_str(w);
            word.clear();
        };
        for c in text.chars() {
            if c.is_ascii_alphanumeric() || c == '_' {
                word.push(c);
            } else {
                flush(&mut word, &mut out);
                out.push(c);
            }
        }
        flush(&mut word, &mut out);
        out
    }

    /// The entry point declared at the start of `s` (`extern "C" __global__ void ...`): its name
    /// and its parameters' C types (`const`, `__restrict__` and the names dropped).
    fn declaration(s: &str) -> (String, Vec<String>) {
        let s = s[s.find("void").expect("void") + 4..].trim_start();
        let s = match s.strip_prefix("__launch_bounds__") {
            Some(r) => &r[r.find(')').expect("launch bounds") + 1..],
            None => s,
        };
        let open = s.find('(').expect("(");
        let close = open + s[open..].find(')').expect(")");
        let types = s[open + 1..close]
            .split(',')
            .map(|p| {
                let p = p.replace("const ", "").replace("__restrict__", "");
                let p = p
                    .trim()
                    .trim_end_matches(|c: char| c.is_ascii_alphanumeric() || c == '_');
                p.split_whitespace().collect::<String>()
            })
            .filter(|t| !t.is_empty())
            .collect();
        (s[..open].trim().to_string(), types)
    }

    /// Every entry point of the kernel source with its parameters' C types, macro-generated
    /// variants expanded.
    fn entry_points() -> Vec<(String, Vec<String>)> {
        const EXTERN: &str = "extern \"C\" __global__";
        let src = KERNELS_CU.replace("\\\n", " ");
        let mut out = Vec::new();
        let mut macros = Vec::new();
        for line in src.lines() {
            let t = line.trim_start();
            if let Some(def) = t.strip_prefix("#define ") {
                if def.contains(EXTERN) {
                    let (open, close) = (def.find('(').unwrap(), def.find(')').unwrap());
                    let formals: Vec<String> = def[open + 1..close]
                        .split(',')
                        .map(|f| f.trim().to_string())
                        .collect();
                    macros.push((
                        def[..open].to_string(),
                        formals,
                        def[close + 1..].to_string(),
                    ));
                }
            }
        }
        let mut at = 0;
        while let Some(i) = src[at..].find(EXTERN) {
            let i = at + i;
            let line = &src[src[..i].rfind('\n').map_or(0, |n| n + 1)..i];
            if !line.trim_start().starts_with("#define") {
                out.push(declaration(&src[i..]));
            }
            at = i + EXTERN.len();
        }
        for line in src.lines() {
            for (name, formals, body) in &macros {
                let Some(args) = line.strip_prefix(&format!("{name}(")) else {
                    continue;
                };
                let args = &args[..args.rfind(')').unwrap()];
                let map: Vec<(String, String)> = formals
                    .iter()
                    .cloned()
                    .zip(args.split(',').map(|a| a.trim().to_string()))
                    .collect();
                let body = substitute(body, &map).replace(" ## ", "").replace("##", "");
                out.push(declaration(&body[body.find(EXTERN).unwrap()..]));
            }
        }
        out
    }

    /// The Rust type the tables write for a C parameter type (`None`: not one the tables use).
    fn rust_type(c: &str) -> Option<String> {
        if let Some(elem) = c.strip_suffix('*') {
            let e = match elem {
                "float" => "f32",
                "int" => "i32",
                // (uint2: a pair of u32, the tensor-core B entries of kernels/gemv.cu)
                "u32" | "uint2" => "u32",
                "u16" => "u16",
                "u64" => "u64",
                "u8" | "void" => "u8",
                "SampleRow" => "SampleRow",
                "SortedSampleRow" => "SortedSampleRow",
                "LogprobRow" => "LogprobRow",
                _ => return None,
            };
            return Some(format!("DevPtr<{e}>"));
        }
        Some(
            match c {
                "int" => "i32",
                "long" => "i64",
                "float" => "f32",
                "double" => "f64",
                "u64" => "u64",
                "Segs" => "Segs",
                "Prep" => "AttnPrep",
                "AttnSeqs" => "AttnSeqs",
                "KvTablePut" => "KvTablePut",
                "Route" => "Route",
                "ExpertPrefetch" => "ExpertPrefetch",
                "ExpertProj" => "ExpertProj",
                "Epi" => "Epi",
                _ => return None,
            }
            .to_string(),
        )
    }

    /// The tables name every entry point of the source once, and each with the parameter list
    /// the source declares: as many parameters, of the same types (a pointer whose element type
    /// differs between an entry's variants is a `DevPtr<u8>`).
    #[test]
    fn tables_match_the_kernel_declarations() {
        let decls = entry_points();
        let mut names: Vec<&str> = decls.iter().map(|(n, _)| n.as_str()).collect();
        names.sort_unstable();
        let mut listed = kernel_names();
        listed.sort_unstable();
        assert_eq!(names, listed, "entry points of the source vs the tables");
        for (variants, rust) in table() {
            let rust: Vec<String> = rust
                .iter()
                .map(|t| t.split_whitespace().collect())
                .collect();
            let cs: Vec<&Vec<String>> = variants
                .iter()
                .map(|v| &decls.iter().find(|(n, _)| n == v).unwrap().1)
                .collect();
            for (v, c) in variants.iter().zip(&cs) {
                assert_eq!(c.len(), rust.len(), "{v}: {c:?} vs {rust:?}");
                for (i, (ct, rt)) in c.iter().zip(&rust).enumerate() {
                    let varies = cs.iter().any(|o| &o[i] != ct);
                    let want = if varies && ct.ends_with('*') {
                        Some("DevPtr<u8>".to_string())
                    } else {
                        rust_type(ct)
                    };
                    assert_eq!(
                        want.as_deref(),
                        Some(rt.as_str()),
                        "{v}: parameter {i} `{ct}`"
                    );
                }
            }
        }
    }
}
