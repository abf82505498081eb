//! Rows of plain structs as text cells, the way the `csv` crate writes them, so that a table's
//! terminal, Markdown and CSV forms show the same text: integers in decimal, floats in `ryu`'s
//! shortest round-trip form (`1.0`, `0.1`, `NaN`, `inf`), `None` as an empty cell, enum
//! variants by their serde names.
//!
//! A serde serializer of its own rather than a round trip through the CSV writer and reader: the
//! cells come out directly, and the one shape a row can take (a struct of scalars and options of
//! scalars) is all it accepts. A nested container is an error, which the tests of every table's
//! row type would show. One thing it takes that the CSV writer refuses: a struct flattened into
//! the row (`#[serde(flatten)]`, which serde writes as a map), whose fields become the row's
//! columns in place, so that a row can hold the key it is a row of without declaring its fields
//! twice.

use serde::ser::{self, Impossible, Serialize};

/// Why a row could not be turned into cells: a field that is not a scalar.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct RowError(String);

impl ser::Error for RowError {
    fn custom<T: std::fmt::Display>(msg: T) -> Self {
        RowError(msg.to_string())
    }
}

fn nested(what: &str) -> RowError {
    RowError(format!("a table cell cannot hold a {what}"))
}

/// The field names and cells of one row (a struct whose fields are scalars or options of them, or
/// structs of such fields flattened into it).
pub fn row_cells<T: Serialize>(row: &T) -> Result<(Vec<String>, Vec<String>), RowError> {
    let mut fields = Fields::default();
    row.serialize(&mut fields)?;
    Ok((fields.names, fields.cells))
}

/// Methods of the row serializer for what is not a struct: each refuses.
macro_rules! not_a_row {
    ($($name:ident($($arg:ty),*)),* $(,)?) => {
        $(fn $name(self, $(_: $arg),*) -> Result<(), RowError> {
            Err(nested("row that is not a struct"))
        })*
    };
}

#[derive(Default)]
struct Fields {
    names: Vec<String>,
    cells: Vec<String>,
}

impl ser::SerializeStruct for &mut Fields {
    type Ok = ();
    type Error = RowError;
    fn serialize_field<V: ?Sized + Serialize>(&mut self, key: &'static str, value: &V) -> Result<(), RowError> {
        self.names.push(key.to_string());
        self.cells.push(value.serialize(Cell)?);
        Ok(())
    }
    fn end(self) -> Result<(), RowError> {
        Ok(())
    }
}

/// A struct with a flattened field, which serde writes as a map of its fields and the inner
/// struct's: each entry is a column, its key the name.
impl ser::SerializeMap for &mut Fields {
    type Ok = ();
    type Error = RowError;
    fn serialize_key<K: ?Sized + Serialize>(&mut self, key: &K) -> Result<(), RowError> {
        self.names.push(key.serialize(Cell)?);
        Ok(())
    }
    fn serialize_value<V: ?Sized + Serialize>(&mut self, value: &V) -> Result<(), RowError> {
        self.cells.push(value.serialize(Cell)?);
        Ok(())
    }
    fn end(self) -> Result<(), RowError> {
        Ok(())
    }
}

/// The row itself: only a struct is a row.
impl<'a> ser::Serializer for &'a mut Fields {
    type Ok = ();
    type Error = RowError;
    type SerializeSeq = Impossible<(), RowError>;
    type SerializeTuple = Impossible<(), RowError>;
    type SerializeTupleStruct = Impossible<(), RowError>;
    type SerializeTupleVariant = Impossible<(), RowError>;
    type SerializeMap = &'a mut Fields;
    type SerializeStruct = &'a mut Fields;
    type SerializeStructVariant = Impossible<(), RowError>;

    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, RowError> {
        Ok(self)
    }
    not_a_row! {
        serialize_bool(bool), serialize_i8(i8), serialize_i16(i16), serialize_i32(i32), serialize_i64(i64),
        serialize_u8(u8), serialize_u16(u16), serialize_u32(u32), serialize_u64(u64), serialize_f32(f32),
        serialize_f64(f64), serialize_char(char), serialize_str(&str), serialize_bytes(&[u8]),
        serialize_unit_struct(&'static str), serialize_unit_variant(&'static str, u32, &'static str),
    }
    fn serialize_none(self) -> Result<(), RowError> {
        Err(nested("row that is not a struct"))
    }
    fn serialize_unit(self) -> Result<(), RowError> {
        Err(nested("row that is not a struct"))
    }
    fn serialize_some<V: ?Sized + Serialize>(self, _: &V) -> Result<(), RowError> {
        Err(nested("row that is not a struct"))
    }
    fn serialize_newtype_struct<V: ?Sized + Serialize>(self, _: &'static str, v: &V) -> Result<(), RowError> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<V: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &V,
    ) -> Result<(), RowError> {
        Err(nested("row that is not a struct"))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, RowError> {
        Err(nested("row that is not a struct"))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, RowError> {
        Err(nested("row that is not a struct"))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, RowError> {
        Err(nested("row that is not a struct"))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, RowError> {
        Err(nested("row that is not a struct"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, RowError> {
        Ok(self)
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, RowError> {
        Err(nested("row that is not a struct"))
    }
}

/// One field's value as the text of its cell.
struct Cell;

impl Cell {
    fn int(v: impl std::fmt::Display) -> Result<String, RowError> {
        Ok(v.to_string())
    }
}

impl ser::Serializer for Cell {
    type Ok = String;
    type Error = RowError;
    type SerializeSeq = Impossible<String, RowError>;
    type SerializeTuple = Impossible<String, RowError>;
    type SerializeTupleStruct = Impossible<String, RowError>;
    type SerializeTupleVariant = Impossible<String, RowError>;
    type SerializeMap = Impossible<String, RowError>;
    type SerializeStruct = Impossible<String, RowError>;
    type SerializeStructVariant = Impossible<String, RowError>;

    fn serialize_bool(self, v: bool) -> Result<String, RowError> {
        Ok(if v { "true" } else { "false" }.to_string())
    }
    fn serialize_i8(self, v: i8) -> Result<String, RowError> {
        Self::int(v)
    }
    fn serialize_i16(self, v: i16) -> Result<String, RowError> {
        Self::int(v)
    }
    fn serialize_i32(self, v: i32) -> Result<String, RowError> {
        Self::int(v)
    }
    fn serialize_i64(self, v: i64) -> Result<String, RowError> {
        Self::int(v)
    }
    fn serialize_i128(self, v: i128) -> Result<String, RowError> {
        Self::int(v)
    }
    fn serialize_u8(self, v: u8) -> Result<String, RowError> {
        Self::int(v)
    }
    fn serialize_u16(self, v: u16) -> Result<String, RowError> {
        Self::int(v)
    }
    fn serialize_u32(self, v: u32) -> Result<String, RowError> {
        Self::int(v)
    }
    fn serialize_u64(self, v: u64) -> Result<String, RowError> {
        Self::int(v)
    }
    fn serialize_u128(self, v: u128) -> Result<String, RowError> {
        Self::int(v)
    }
    fn serialize_f32(self, v: f32) -> Result<String, RowError> {
        Ok(ryu::Buffer::new().format(v).to_string())
    }
    fn serialize_f64(self, v: f64) -> Result<String, RowError> {
        Ok(ryu::Buffer::new().format(v).to_string())
    }
    fn serialize_char(self, v: char) -> Result<String, RowError> {
        Ok(v.to_string())
    }
    fn serialize_str(self, v: &str) -> Result<String, RowError> {
        Ok(v.to_string())
    }
    fn serialize_bytes(self, _: &[u8]) -> Result<String, RowError> {
        Err(nested("byte string"))
    }
    fn serialize_none(self) -> Result<String, RowError> {
        Ok(String::new())
    }
    fn serialize_some<V: ?Sized + Serialize>(self, v: &V) -> Result<String, RowError> {
        v.serialize(self)
    }
    fn serialize_unit(self) -> Result<String, RowError> {
        Ok(String::new())
    }
    fn serialize_unit_struct(self, _: &'static str) -> Result<String, RowError> {
        Ok(String::new())
    }
    fn serialize_unit_variant(self, _: &'static str, _: u32, variant: &'static str) -> Result<String, RowError> {
        Ok(variant.to_string())
    }
    fn serialize_newtype_struct<V: ?Sized + Serialize>(self, _: &'static str, v: &V) -> Result<String, RowError> {
        v.serialize(self)
    }
    fn serialize_newtype_variant<V: ?Sized + Serialize>(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: &V,
    ) -> Result<String, RowError> {
        Err(nested("enum variant with data"))
    }
    fn serialize_seq(self, _: Option<usize>) -> Result<Self::SerializeSeq, RowError> {
        Err(nested("sequence"))
    }
    fn serialize_tuple(self, _: usize) -> Result<Self::SerializeTuple, RowError> {
        Err(nested("tuple"))
    }
    fn serialize_tuple_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeTupleStruct, RowError> {
        Err(nested("tuple struct"))
    }
    fn serialize_tuple_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeTupleVariant, RowError> {
        Err(nested("enum variant with data"))
    }
    fn serialize_map(self, _: Option<usize>) -> Result<Self::SerializeMap, RowError> {
        Err(nested("map"))
    }
    fn serialize_struct(self, _: &'static str, _: usize) -> Result<Self::SerializeStruct, RowError> {
        Err(nested("struct"))
    }
    fn serialize_struct_variant(
        self,
        _: &'static str,
        _: u32,
        _: &'static str,
        _: usize,
    ) -> Result<Self::SerializeStructVariant, RowError> {
        Err(nested("enum variant with data"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Serialize)]
    #[serde(rename_all = "snake_case")]
    enum Kind {
        #[serde(rename = "optimizer+params")]
        Both,
        Plain,
    }

    #[derive(serde::Serialize)]
    struct Row {
        name: String,
        n: u64,
        neg: i32,
        ms: f64,
        ratio: Option<f64>,
        absent: Option<u32>,
        kind: Kind,
        other: Option<Kind>,
        flag: bool,
    }

    /// Every kind of cell is the text the CSV writer gives it, field by field.
    #[test]
    fn cells_are_what_csv_writes() {
        let rows = [
            Row {
                name: "a,b".into(),
                n: u64::MAX,
                neg: -3,
                ms: 1.0,
                ratio: Some(0.1),
                absent: None,
                kind: Kind::Both,
                other: Some(Kind::Plain),
                flag: true,
            },
            Row {
                name: String::new(),
                n: 0,
                neg: 0,
                ms: f64::NAN,
                ratio: Some(f64::INFINITY),
                absent: Some(7),
                kind: Kind::Plain,
                other: None,
                flag: false,
            },
            Row {
                name: "é".into(),
                n: 12,
                neg: 1,
                ms: 1e21,
                ratio: Some(-0.0),
                absent: None,
                kind: Kind::Plain,
                other: None,
                flag: false,
            },
            Row {
                name: "x".into(),
                n: 1,
                neg: 1,
                ms: 123456.789,
                ratio: Some(3e-7),
                absent: None,
                kind: Kind::Plain,
                other: None,
                flag: true,
            },
        ];
        let mut w = csv::WriterBuilder::new().has_headers(true).from_writer(Vec::new());
        for r in &rows {
            w.serialize(r).unwrap();
        }
        let text = w.into_inner().unwrap();
        let mut csv_rows = csv::ReaderBuilder::new().has_headers(false).from_reader(text.as_slice()).into_records();
        let header: Vec<String> = csv_rows.next().unwrap().unwrap().iter().map(str::to_string).collect();
        for r in &rows {
            let (names, cells) = row_cells(r).unwrap();
            assert_eq!(names, header);
            let want: Vec<String> = csv_rows.next().unwrap().unwrap().iter().map(str::to_string).collect();
            assert_eq!(cells, want);
        }
    }

    /// A field that is a container is refused, not flattened into something a CSV cannot hold;
    /// so is one inside a struct flattened into the row.
    #[test]
    fn nested_fields_are_errors() {
        #[derive(serde::Serialize)]
        struct Bad {
            list: Vec<u32>,
        }
        #[derive(serde::Serialize)]
        struct HoldsBad {
            n: u32,
            #[serde(flatten)]
            bad: Bad,
        }
        assert!(row_cells(&Bad { list: vec![1] }).unwrap_err().to_string().contains("sequence"));
        assert!(row_cells(&HoldsBad { n: 1, bad: Bad { list: vec![1] } })
            .unwrap_err()
            .to_string()
            .contains("sequence"));
        assert!(row_cells(&5u32).is_err());
    }

    /// A struct flattened into a row gives its fields as columns in place, the same names and
    /// cells as the row that declares them itself; a field it skips is no column.
    #[test]
    fn a_flattened_struct_is_its_fields_in_place() {
        #[derive(serde::Serialize)]
        struct Key {
            model: String,
            stage: Option<u32>,
            kind: Kind,
            #[serde(skip)]
            _line: u32,
        }
        #[derive(serde::Serialize)]
        struct Nested {
            first: f64,
            #[serde(flatten)]
            key: Key,
            last: Option<u64>,
        }
        #[derive(serde::Serialize)]
        struct Flat {
            first: f64,
            model: String,
            stage: Option<u32>,
            kind: Kind,
            last: Option<u64>,
        }
        let nested = Nested {
            first: 0.5,
            key: Key { model: "gpt2".into(), stage: None, kind: Kind::Both, _line: 3 },
            last: Some(7),
        };
        let flat = Flat { first: 0.5, model: "gpt2".into(), stage: None, kind: Kind::Both, last: Some(7) };
        let (names, cells) = row_cells(&nested).unwrap();
        assert_eq!(names, ["first", "model", "stage", "kind", "last"]);
        assert_eq!(cells, ["0.5", "gpt2", "", "optimizer+params", "7"]);
        assert_eq!(row_cells(&flat).unwrap(), (names, cells));
    }
}
