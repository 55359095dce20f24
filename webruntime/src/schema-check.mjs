// ajv with JSON Schema 2020-12 and string formats, bundled as dist/schema-check.js for the site's
// JSON mode and the browser tests (it is not part of the npm package).
import Ajv2020 from "ajv/dist/2020";
import addFormats from "ajv-formats";

/** null when ``text`` is JSON that satisfies ``schema``, else what is wrong. */
export function checkJson(schema, text) {
  let value;
  try {
    value = JSON.parse(text);
  } catch (err) {
    return `not JSON: ${err.message}`;
  }
  const ajv = addFormats(new Ajv2020({ strict: false }));
  return ajv.validate(schema, value) ? null : ajv.errorsText();
}
