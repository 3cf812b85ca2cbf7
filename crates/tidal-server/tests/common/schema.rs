//! A JSON Schema check for the subset `/openapi.json` uses (draft 2020-12 as schemars writes it):
//! `$ref` into the document, `type` (one or a list), `properties`, `required`,
//! `additionalProperties`, `items`, `oneOf`, `anyOf`, `allOf`, `const`, `enum`, `minimum`,
//! `minItems`, `maxItems`, boolean schemas. A keyword it does not know fails the check, so a schema
//! it cannot judge is never passed silently.

use serde_json::Value;

const IGNORED: &[&str] = &["description", "format", "default", "title", "$schema", "examples"];

/// Why `value` does not satisfy `schema` (resolved against `document`), or Ok.
pub fn validate(document: &Value, schema: &Value, value: &Value, at: &str) -> Result<(), String> {
    let schema = match schema {
        Value::Bool(true) => return Ok(()),
        Value::Bool(false) => return Err(format!("{at}: no value is allowed here")),
        Value::Object(schema) => schema,
        other => return Err(format!("{at}: not a schema: {other}")),
    };
    for (keyword, rule) in schema {
        match keyword.as_str() {
            "$ref" => {
                let pointer =
                    rule.as_str().and_then(|r| r.strip_prefix('#')).ok_or(format!("{at}: bad $ref"))?;
                let target = document.pointer(pointer).ok_or(format!("{at}: unresolved $ref {pointer}"))?;
                validate(document, target, value, at)?;
            }
            "type" => check_type(rule, value, at)?,
            "properties" => {
                for (name, property) in rule.as_object().into_iter().flatten() {
                    if let Some(field) = value.get(name) {
                        validate(document, property, field, &format!("{at}.{name}"))?;
                    }
                }
            }
            "required" => {
                for name in rule.as_array().into_iter().flatten().filter_map(Value::as_str) {
                    if value.is_object() && value.get(name).is_none() {
                        return Err(format!("{at}: required field {name:?} missing"));
                    }
                }
            }
            "additionalProperties" => additional(document, schema, rule, value, at)?,
            "items" => {
                for (i, item) in value.as_array().into_iter().flatten().enumerate() {
                    validate(document, rule, item, &format!("{at}[{i}]"))?;
                }
            }
            "oneOf" | "anyOf" => {
                let options = rule.as_array().ok_or(format!("{at}: {keyword} is not a list"))?;
                let passed =
                    options.iter().filter(|option| validate(document, option, value, at).is_ok()).count();
                let fine = if keyword == "oneOf" { passed == 1 } else { passed >= 1 };
                if !fine {
                    return Err(format!(
                        "{at}: {passed} of the {} {keyword} options match {value}",
                        options.len()
                    ));
                }
            }
            "allOf" => {
                for option in rule.as_array().into_iter().flatten() {
                    validate(document, option, value, at)?;
                }
            }
            "const" if rule != value => return Err(format!("{at}: {value} is not {rule}")),
            "enum" if !rule.as_array().is_some_and(|options| options.contains(value)) => {
                return Err(format!("{at}: {value} is not one of {rule}"))
            }
            "minimum" if value.as_f64().zip(rule.as_f64()).is_some_and(|(v, min)| v < min) => {
                return Err(format!("{at}: {value} is below {rule}"))
            }
            "minItems" | "maxItems" => check_length(keyword, rule, value, at)?,
            "const" | "enum" | "minimum" => {}
            known if IGNORED.contains(&known) => {}
            unknown => return Err(format!("{at}: the check does not know the keyword {unknown:?}")),
        }
    }
    Ok(())
}

fn check_type(rule: &Value, value: &Value, at: &str) -> Result<(), String> {
    let allowed: Vec<&str> = match rule {
        Value::String(one) => vec![one.as_str()],
        Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
        _ => return Err(format!("{at}: bad type {rule}")),
    };
    let fits = |kind: &str| match kind {
        "object" => value.is_object(),
        "array" => value.is_array(),
        "string" => value.is_string(),
        "boolean" => value.is_boolean(),
        "null" => value.is_null(),
        "number" => value.is_number(),
        "integer" => value.is_i64() || value.is_u64(),
        _ => false,
    };
    if allowed.iter().any(|kind| fits(kind)) {
        Ok(())
    } else {
        Err(format!("{at}: {value} is not of type {rule}"))
    }
}

fn additional(
    document: &Value,
    schema: &serde_json::Map<String, Value>,
    rule: &Value,
    value: &Value,
    at: &str,
) -> Result<(), String> {
    let known = schema.get("properties").and_then(Value::as_object);
    for (name, field) in value.as_object().into_iter().flatten() {
        if known.is_some_and(|known| known.contains_key(name)) {
            continue;
        }
        validate(document, rule, field, &format!("{at}.{name}"))
            .map_err(|_| format!("{at}: unknown field {name:?}"))?;
    }
    Ok(())
}

fn check_length(keyword: &str, rule: &Value, value: &Value, at: &str) -> Result<(), String> {
    let (Some(items), Some(bound)) = (value.as_array(), rule.as_u64()) else { return Ok(()) };
    let len = items.len() as u64;
    let fine = if keyword == "minItems" { len >= bound } else { len <= bound };
    if fine {
        Ok(())
    } else {
        Err(format!("{at}: {len} items, {keyword} {bound}"))
    }
}
