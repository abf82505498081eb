//! The field names of a struct, read from its serde derive.
//!
//! A struct's `Deserialize` derive hands its deserializer the list of field names (after renames,
//! in declaration order) when it asks for a struct. [`field_names`] offers it a deserializer that
//! keeps that list and stops, so code that walks a configuration by name (the variant string, the
//! worker flags, the spec's worker keys) gets the names from the struct itself instead of a second
//! list that a new field could be missing from.

use serde::de::{self, Deserialize, Deserializer, Visitor};

/// The serialized names of `T`'s fields in declaration order; empty when `T` does not deserialize
/// as a struct (a map, an enum, a flattened struct).
pub fn field_names<'de, T: Deserialize<'de>>() -> &'static [&'static str] {
    let mut names: &'static [&'static str] = &[];
    // The derive's error is the expected outcome: the recorder never yields a value.
    let _ = T::deserialize(Recorder { names: &mut names });
    names
}

/// A deserializer that remembers the field list it is asked for and fails every request.
struct Recorder<'a> {
    names: &'a mut &'static [&'static str],
}

impl<'de> Deserializer<'de> for Recorder<'_> {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Self::Error> {
        *self.names = fields;
        Err(de::Error::custom("field names recorded"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf option
        unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize)]
    #[allow(dead_code)]
    struct Sample {
        first: u32,
        #[serde(rename = "second_name")]
        second: Option<String>,
        #[serde(default)]
        third: f64,
    }

    #[test]
    fn names_come_in_declaration_order_after_renames() {
        assert_eq!(field_names::<Sample>(), ["first", "second_name", "third"]);
    }

    #[test]
    fn what_is_not_a_struct_has_no_fields() {
        assert!(field_names::<u32>().is_empty());
        assert!(field_names::<std::collections::BTreeMap<String, u32>>().is_empty());
    }
}
