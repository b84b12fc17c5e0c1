//! The values that take more than one form (a text or a table, a number
//! or a text), read by hand rather than as serde's untagged enums: an
//! untagged enum tries each form and, when none fits, says only which
//! forms there are, so a typo inside the table form (`{ cookei = "sid" }`)
//! never reached the message. Here the value's own shape picks the form,
//! and a table is read as its struct, whose errors name the key that is
//! wrong and the keys that exist.

use std::fmt;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Unexpected, Visitor};

use super::{RawEndpoint, RawMaxRequests, RawPattern, RawSize, RawSticky, RawStickyTable, RawWant, RawWeighted};

/// A table form, read as the struct `T` (its `deny_unknown_fields` and
/// missing-key errors come through with the key path the `config` crate
/// adds around them).
fn table<'de, T: Deserialize<'de>, A: MapAccess<'de>>(map: A) -> Result<T, A::Error> {
    T::deserialize(de::value::MapAccessDeserializer::new(map))
}

/// A table form written as a list of its values in field order, which
/// the untagged enums these visitors replaced took (`[["http://h:1", 3]]`
/// for an endpoint): kept, so that a file that loaded still loads.
fn fields<'de, T: Deserialize<'de>, A: SeqAccess<'de>>(seq: A) -> Result<T, A::Error> {
    T::deserialize(de::value::SeqAccessDeserializer::new(seq))
}

/// A visitor that says what its type accepts, in the file's words.
struct Expecting<T>(&'static str, std::marker::PhantomData<T>);

impl<T> Expecting<T> {
    fn new(what: &'static str) -> Self {
        Expecting(what, std::marker::PhantomData)
    }
}

const SIZE: &str = "a size such as \"64KiB\" or a number of bytes";

impl<'de> Visitor<'de> for Expecting<RawSize> {
    type Value = RawSize;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<RawSize, E> {
        Ok(RawSize::Bytes(n))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<RawSize, E> {
        u64::try_from(n).map(RawSize::Bytes).map_err(|_| E::invalid_value(Unexpected::Signed(n), &self))
    }

    fn visit_f64<E: de::Error>(self, n: f64) -> Result<RawSize, E> {
        Err(E::custom(format!("{n} is not a whole number of bytes; a fraction needs a unit, e.g. \"1.5MiB\"")))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<RawSize, E> {
        Ok(RawSize::Text(text.to_owned()))
    }
}

impl<'de> Deserialize<'de> for RawSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Expecting::<RawSize>::new(SIZE))
    }
}

impl<'de> Visitor<'de> for Expecting<RawMaxRequests> {
    type Value = RawMaxRequests;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_u64<E: de::Error>(self, n: u64) -> Result<RawMaxRequests, E> {
        Ok(RawMaxRequests::Count(n))
    }

    fn visit_i64<E: de::Error>(self, n: i64) -> Result<RawMaxRequests, E> {
        u64::try_from(n).map(RawMaxRequests::Count).map_err(|_| E::invalid_value(Unexpected::Signed(n), &self))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<RawMaxRequests, E> {
        Ok(RawMaxRequests::Text(text.to_owned()))
    }
}

impl<'de> Deserialize<'de> for RawMaxRequests {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Expecting::<RawMaxRequests>::new("a number or \"auto\""))
    }
}

impl<'de> Visitor<'de> for Expecting<RawEndpoint> {
    type Value = RawEndpoint;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_str<E: de::Error>(self, url: &str) -> Result<RawEndpoint, E> {
        Ok(RawEndpoint::Url(url.to_owned()))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawEndpoint, A::Error> {
        table::<RawWeighted, A>(map).map(RawEndpoint::Weighted)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<RawEndpoint, A::Error> {
        fields::<RawWeighted, A>(seq).map(RawEndpoint::Weighted)
    }
}

impl<'de> Deserialize<'de> for RawEndpoint {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let what = "a URL or a table ({ url = \"http://host:port\", weight = 2 })";
        d.deserialize_any(Expecting::<RawEndpoint>::new(what))
    }
}

impl<'de> Visitor<'de> for Expecting<RawSticky> {
    type Value = RawSticky;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<RawSticky, E> {
        Ok(RawSticky::Text(text.to_owned()))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawSticky, A::Error> {
        table::<RawStickyTable, A>(map).map(RawSticky::Table)
    }
}

impl<'de> Deserialize<'de> for RawSticky {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let what = "\"header:NAME\", \"cookie:NAME\" or a table ({ cookie = \"NAME\" })";
        d.deserialize_any(Expecting::<RawSticky>::new(what))
    }
}

/// A condition's number is refused without being shown: under a header
/// such as `X-Api-Key` it may be the secret itself.
const NUMBER_IN_CONDITION: &str = "a number is not taken here: write the value as a text, in quotes (\"2\"); \
     a condition is a text, true, false or a table ({ regex = \"...\" })";

impl<'de> Visitor<'de> for Expecting<RawWant> {
    type Value = RawWant;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.0)
    }

    fn visit_bool<E: de::Error>(self, flag: bool) -> Result<RawWant, E> {
        Ok(RawWant::Flag(flag))
    }

    fn visit_i64<E: de::Error>(self, _: i64) -> Result<RawWant, E> {
        Err(E::custom(NUMBER_IN_CONDITION))
    }

    fn visit_u64<E: de::Error>(self, _: u64) -> Result<RawWant, E> {
        Err(E::custom(NUMBER_IN_CONDITION))
    }

    fn visit_f64<E: de::Error>(self, _: f64) -> Result<RawWant, E> {
        Err(E::custom(NUMBER_IN_CONDITION))
    }

    fn visit_str<E: de::Error>(self, text: &str) -> Result<RawWant, E> {
        Ok(RawWant::Text(text.to_owned()))
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<RawWant, A::Error> {
        table::<RawPattern, A>(map).map(RawWant::Pattern)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<RawWant, A::Error> {
        fields::<RawPattern, A>(seq).map(RawWant::Pattern)
    }
}

impl<'de> Deserialize<'de> for RawWant {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(Expecting::<RawWant>::new("a text, true, false or a table ({ regex = \"...\" })"))
    }
}
