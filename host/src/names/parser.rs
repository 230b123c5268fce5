//! A choice as clap reads it from the library's tables ([`Named`]): its names, what each
//! value does, and clap's error for any other value, so a choice is written once.

use std::ffi::OsStr;
use std::marker::PhantomData;

use super::Named;
use clap::builder::{PossibleValue, PossibleValuesParser, TypedValueParser};

/// A clap value parser for the choice `T`: its names are [`Named::NAMES`], their help
/// [`Named::HELP`].
#[derive(Clone, Copy)]
pub struct NamedParser<T>(PhantomData<fn() -> T>);

/// The parser of choice `T` (`#[arg(value_parser = parser::<T>())]`).
pub fn parser<T: Named>() -> NamedParser<T> {
    NamedParser(PhantomData)
}

/// Every value of `T` as clap lists it, with its help when the table has one.
fn possible<T: Named>() -> Vec<PossibleValue> {
    T::NAMES
        .iter()
        .enumerate()
        .map(|(i, (name, _))| {
            let value = PossibleValue::new(*name);
            match T::HELP.get(i) {
                Some(help) => value.help(*help),
                None => value,
            }
        })
        .collect()
}

impl<T: Named + Send + Sync> TypedValueParser for NamedParser<T> {
    type Value = T;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &OsStr,
    ) -> Result<T, clap::Error> {
        // clap's own parser of possible values gives its usual error (the names, and a
        // similar one) for any other value.
        let name = PossibleValuesParser::new(possible::<T>()).parse_ref(cmd, arg, value)?;
        T::from_name(&name, false)
            .ok_or_else(|| clap::Error::new(clap::error::ErrorKind::InvalidValue).with_cmd(cmd))
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = PossibleValue> + '_>> {
        Some(Box::new(possible::<T>().into_iter()))
    }
}
