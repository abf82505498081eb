//! The text form of the schema's field-less enums, declared once per enum.

/// Generates `FromStr`, `Display` and a list of accepted spellings for a field-less enum whose
/// text form is fixed (the same strings in flags, YAML, JSON logs and table headers).
macro_rules! text_enum {
    ($ty:ident, $what:literal, { $($variant:ident => $text:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];
            /// The text form used in flags, specs, logs and tables.
            pub fn as_str(self) -> &'static str {
                match self { $($ty::$variant => $text),+ }
            }
        }
        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result { f.write_str(self.as_str()) }
        }
        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> Result<Self, String> {
                match s {
                    $($text => Ok($ty::$variant),)+
                    _ => Err(format!(
                        "unknown {} '{}' (expected one of: {})",
                        $what, s, [$($text),+].join(", ")
                    )),
                }
            }
        }
    };
}
pub(crate) use text_enum;
