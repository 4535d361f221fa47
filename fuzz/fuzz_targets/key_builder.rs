//! `KeyBuilder` under arbitrary sequences of field, option and extra calls.
//!
//! A key names an entry on disk: two different inputs must never share one (a wrong binary
//! would be loaded) and one input must always give the same one (or nothing is ever found).
//! The target replays the calls into a model of what the documentation says a key depends on
//! (the last value of each field, unset distinct from empty; the set of option pairs and the
//! set of extra pairs, order-free; a duplicate name is an error), then checks:
//!
//! - determinism: the same calls give the same key, and `finish` is `finish_with_schema` of
//!   the current schema, while another schema gives another key;
//! - the error rule: `finish` fails exactly when an option or extra name repeats;
//! - injectivity over variants of the input: values swapped between fields, moved between
//!   fields, an option turned into an extra, bytes moved across a name/value boundary, a field
//!   unset or set to empty. Every variant is rebuilt from its model and keys must be equal
//!   exactly when models are.
#![no_main]

use std::collections::{BTreeMap, HashMap};

use arbitrary::Arbitrary;
use kcache::key::{Field, KEY_SCHEMA_VERSION, Key, KeyBuilder};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug, Clone)]
enum Call {
    /// Through `KeyBuilder::set` with `Field::from_index`.
    Set(u8, Vec<u8>),
    /// Through the named setter of the field.
    Named(u8, Vec<u8>),
    Option(Vec<u8>, Vec<u8>),
    Extra(Vec<u8>, Vec<u8>),
}

/// What a key is documented to depend on.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Model {
    fields: [Option<Vec<u8>>; 7],
    options: BTreeMap<Vec<u8>, Vec<u8>>,
    extras: BTreeMap<Vec<u8>, Vec<u8>>,
}

fn field(index: u8) -> Field {
    Field::from_index(u32::from(index) % 7).expect("indices below 7 name a field")
}

fn apply(b: &mut KeyBuilder, call: &Call) {
    match call {
        Call::Set(i, v) => {
            b.set(field(*i), v);
        }
        Call::Named(i, v) => {
            match field(*i) {
                Field::Backend => b.backend(v),
                Field::DeviceName => b.device_name(v),
                Field::DeviceVendor => b.device_vendor(v),
                Field::DriverVersion => b.driver_version(v),
                Field::CompilerVersion => b.compiler_version(v),
                Field::Entry => b.entry(v),
                Field::Source => b.source(v),
            };
        }
        Call::Option(n, v) => {
            b.option(n, v);
        }
        Call::Extra(n, v) => {
            b.extra(n, v);
        }
    }
}

/// The model of `calls`, or `None` when a name repeats (so `finish` must fail).
fn model_of(calls: &[Call]) -> Option<Model> {
    let mut m = Model::default();
    for call in calls {
        match call {
            Call::Set(i, v) | Call::Named(i, v) => m.fields[field(*i) as usize] = Some(v.clone()),
            Call::Option(n, v) => {
                if m.options.insert(n.clone(), v.clone()).is_some() {
                    return None;
                }
            }
            Call::Extra(n, v) => {
                if m.extras.insert(n.clone(), v.clone()).is_some() {
                    return None;
                }
            }
        }
    }
    Some(m)
}

/// A builder fed the model's content in a fixed order unrelated to the original calls.
fn key_of(m: &Model) -> Key {
    let mut b = KeyBuilder::new();
    // Extras, then options in reverse, then fields last to first: order must not matter.
    for (n, v) in &m.extras {
        b.extra(n, v);
    }
    for (n, v) in m.options.iter().rev() {
        b.option(n, v);
    }
    for (i, v) in m.fields.iter().enumerate().rev() {
        if let Some(v) = v {
            b.set(Field::ALL[i], v);
        }
    }
    b.finish().expect("a model has no duplicate names")
}

/// Variants of `m` that differ from it in one documented dimension.
fn variants(m: &Model) -> Vec<Model> {
    let mut out = Vec::new();
    let set: Vec<usize> = (0..7).filter(|&i| m.fields[i].is_some()).collect();
    for &i in &set {
        for j in 0..7 {
            if i == j {
                continue;
            }
            // Swap the values of two fields.
            let mut v = m.clone();
            v.fields.swap(i, j);
            out.push(v);
            // Move a value into another field.
            let mut v = m.clone();
            v.fields[j] = v.fields[i].take();
            out.push(v);
        }
        // Unset versus empty.
        let mut v = m.clone();
        v.fields[i] = None;
        out.push(v);
        let mut v = m.clone();
        v.fields[i] = Some(Vec::new());
        out.push(v);
        // Bytes moved across the boundary to the next field.
        if let Some(next) = (i + 1..7).find(|&j| m.fields[j].is_some()) {
            let mut v = m.clone();
            if let Some(byte) = v.fields[i].as_mut().and_then(|f| f.pop()) {
                v.fields[next].as_mut().unwrap().insert(0, byte);
                out.push(v);
            }
        }
    }
    for (n, val) in m.options.iter().take(4) {
        // The same pair in the other namespace.
        if !m.extras.contains_key(n) {
            let mut v = m.clone();
            v.options.remove(n);
            v.extras.insert(n.clone(), val.clone());
            out.push(v);
        }
        // A byte moved from the value into the name.
        if let Some((&first, rest)) = val.split_first() {
            let mut name = n.clone();
            name.push(first);
            if !m.options.contains_key(&name) {
                let mut v = m.clone();
                v.options.remove(n);
                v.options.insert(name, rest.to_vec());
                out.push(v);
            }
        }
        // The pair dropped.
        let mut v = m.clone();
        v.options.remove(n);
        out.push(v);
    }
    for n in m.extras.keys().take(4) {
        if !m.options.contains_key(n) {
            let mut v = m.clone();
            let val = v.extras.remove(n).unwrap();
            v.options.insert(n.clone(), val);
            out.push(v);
        }
    }
    out
}

fuzz_target!(|calls: Vec<Call>| {
    let calls = &calls[..calls.len().min(32)];
    // Key names are parsed back from file names: any text that parses must be the canonical
    // spelling of the key it parses to.
    for call in calls {
        if let Call::Set(_, v) | Call::Named(_, v) = call
            && let Some(parsed) = std::str::from_utf8(v).ok().and_then(Key::from_hex)
        {
            assert_eq!(parsed.to_hex().as_bytes(), &v[..]);
        }
    }
    let mut b = KeyBuilder::new();
    for call in calls {
        apply(&mut b, call);
    }
    let result = b.finish();

    // Determinism: the same calls again, on a fresh builder and on a clone.
    let mut again = KeyBuilder::new();
    for call in calls {
        apply(&mut again, call);
    }
    let again = again.finish();
    let cloned = b.clone().finish();
    match (&result, &again, &cloned) {
        (Ok(a), Ok(b), Ok(c)) => assert!(a == b && b == c),
        (Err(_), Err(_), Err(_)) => {}
        _ => panic!("the same calls gave {result:?}, {again:?}, {cloned:?}"),
    }

    let model = model_of(calls);
    assert_eq!(
        result.is_ok(),
        model.is_some(),
        "finish must fail exactly when an option or extra name repeats: {result:?}"
    );
    if let Err(e) = &result {
        assert!(matches!(e, kcache::Error::InvalidArgument(_)), "{e:?}");
    }
    let (Ok(key), Some(model)) = (result, model) else {
        return;
    };

    // The documented schema rule.
    assert_eq!(b.finish_with_schema(KEY_SCHEMA_VERSION).unwrap(), key);
    assert_ne!(b.finish_with_schema(KEY_SCHEMA_VERSION + 1).unwrap(), key);
    // The key depends on the model only: rebuilt from it in another order, it is the same.
    assert_eq!(key_of(&model), key, "the key depends on call order");
    // Hex is the on-disk name: it must round-trip.
    assert_eq!(Key::from_hex(&key.to_hex()), Some(key));

    // Injectivity over the variants: equal keys exactly for equal models.
    let mut seen: HashMap<Key, Model> = HashMap::new();
    seen.insert(key, model.clone());
    for variant in variants(&model) {
        let k = key_of(&variant);
        if let Some(previous) = seen.insert(k, variant.clone()) {
            assert_eq!(
                previous, variant,
                "two different inputs share key {k}:\n{previous:?}\n{variant:?}"
            );
        }
    }
});
