// Run a rollout with the official MCP TypeScript SDK (@modelcontextprotocol/sdk), then fetch the whole result.
//
//   npm install @modelcontextprotocol/sdk@1.32.2
//   node mcp_client.mjs http://127.0.0.1:8000/mcp '{"split": "bundled"}' [token] [out.json]
//
// run_rollout answers with the result's summary (ok, reward, grading, counts) and resource links; the whole result is
// read page by page with resources/read and checked against the summary's SHA-256. A rollout takes minutes: give the
// call a timeout of its own (the SDK's default is 60 s) or let progress notifications reset it.
// Prints one JSON line. tests/test_mcp_size.py runs this file.
import { createHash } from "node:crypto";
import { writeFileSync } from "node:fs";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

const [url, argsJson = "{}", token, out] = process.argv.slice(2);
const headers = token ? { Authorization: `Bearer ${token}` } : {};
const client = new Client({ name: "swe-gym-example", version: "1.0.0" });
await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));

let t0 = performance.now();
const res = await client.callTool({ name: "run_rollout", arguments: JSON.parse(argsJson) }, undefined, {
  timeout: 3_600_000,
  resetTimeoutOnProgress: true,
  onprogress: () => {},
});
const summary = res.structuredContent; // ok, reward, grading, findings, counts, result_uri, page_uris, sha256
if (res.isError || !summary) throw new Error(`run_rollout failed: ${JSON.stringify(res.content)}`);
const callS = (performance.now() - t0) / 1000;

t0 = performance.now();
const pages = [];
for (const uri of summary.page_uris) {
  const page = await client.readResource({ uri });
  pages.push(Buffer.from(page.contents[0].text, "utf8"));
}
const whole = Buffer.concat(pages);
const fetchS = (performance.now() - t0) / 1000;
if (out) writeFileSync(out, whole);
console.log(
  JSON.stringify({
    rollout_id: summary.rollout_id,
    ok: summary.ok,
    summary_bytes: Buffer.byteLength(JSON.stringify(res)),
    links: res.content.filter((c) => c.type === "resource_link").length,
    pages: summary.pages,
    result_bytes: whole.length,
    sha256_ok: createHash("sha256").update(whole).digest("hex") === summary.sha256,
    call_s: callS,
    fetch_s: fetchS,
  }),
);
await client.close();
