// Drives `hyla serve`'s /v1/messages with the official `@anthropic-ai/sdk` npm package (run by
// tests/test_serve.cpp): the SDK parses every response and event stream with its own types.
//   node anthropic_client.cjs BASE_URL MODEL SCENARIO.json
// Exits non-zero with a message on the first failed check.
const fs = require("fs");
const assert = require("assert");
const { Anthropic } = require("@anthropic-ai/sdk");

const [baseURL, model, scenarioPath] = process.argv.slice(2);
const scenario = JSON.parse(fs.readFileSync(scenarioPath, "utf8"));
const client = new Anthropic({ baseURL, apiKey: "unused", maxRetries: 0, timeout: 60000 });

const tools = scenario.tools.map((t) => ({
  name: t.function.name, description: t.function.description, input_schema: t.function.parameters,
}));
const hello = [{ role: "user", content: scenario.hello_messages[0].content }];
const weather = [{ role: "user", content: scenario.weather_messages[0].content }];
const textOf = (message) => message.content.filter((b) => b.type === "text").map((b) => b.text).join("");

async function rejectsWith(promise, status, pattern) {
  await assert.rejects(promise, (e) => {
    assert.ok(e instanceof Anthropic.APIError, `an APIError, got ${e}`);
    assert.strictEqual(e.status, status, e.message);
    assert.strictEqual(e.error.type, "error", JSON.stringify(e.error));
    assert.ok(pattern.test(e.message), e.message);
    return true;
  });
}

async function main() {
  // Text, as a string and as blocks with cache_control (accepted, ignored): the memorised reply.
  const plain = await client.messages.create({ model, max_tokens: 32, messages: hello, temperature: 0 });
  assert.strictEqual(plain.type, "message");
  assert.strictEqual(plain.role, "assistant");
  assert.strictEqual(textOf(plain), scenario.hello_reply);
  assert.strictEqual(plain.stop_reason, "end_turn");
  assert.ok(plain.usage.input_tokens + plain.usage.cache_read_input_tokens > 0 && plain.usage.output_tokens > 0);
  const blocks = await client.messages.create({
    model, max_tokens: 32, temperature: 0,
    messages: [{ role: "user", content: [{ type: "text", text: hello[0].content, cache_control: { type: "ephemeral" } }] }],
  });
  assert.strictEqual(textOf(blocks), scenario.hello_reply);

  // count_tokens counts the prompt create reads.
  const counted = await client.messages.countTokens({ model, messages: hello });
  assert.strictEqual(counted.input_tokens, plain.usage.input_tokens + plain.usage.cache_read_input_tokens);

  // A stop sequence ends the reply before it and is named.
  const stopped = await client.messages.create({ model, max_tokens: 32, messages: hello, temperature: 0, stop_sequences: ["friend"] });
  assert.strictEqual(stopped.stop_reason, "stop_sequence");
  assert.strictEqual(stopped.stop_sequence, "friend");
  assert.strictEqual(textOf(stopped), scenario.hello_reply.slice(0, scenario.hello_reply.indexOf("friend")));

  // Images as base64 blocks.
  for (const c of scenario.image_cases) {
    const url = c.messages[0].content[1].image_url.url;
    const seen = await client.messages.create({
      model, max_tokens: 16, temperature: 0,
      messages: [{ role: "user", content: [
        { type: "text", text: c.messages[0].content[0].text },
        { type: "image", source: { type: "base64", media_type: "image/png", data: url.slice(url.indexOf(",") + 1) } },
      ] }],
    });
    assert.strictEqual(textOf(seen), c.reply);
  }

  // A tool call, then the tool loop: its result answers the call and the model replies.
  const call = await client.messages.create({ model, max_tokens: 64, messages: weather, tools, temperature: 0 });
  assert.strictEqual(call.stop_reason, "tool_use");
  const use = call.content.find((b) => b.type === "tool_use");
  assert.ok(use && use.name === "get_weather", JSON.stringify(call.content));
  assert.deepStrictEqual(use.input, { city: "Paris" });
  const loop = [...weather, { role: "assistant", content: call.content },
    { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "18 C and sunny" }] }];
  const after = await client.messages.create({ model, max_tokens: 8, messages: loop, tools, temperature: 0 });
  assert.ok(["end_turn", "max_tokens", "tool_use"].includes(after.stop_reason), after.stop_reason);

  // A forced call (tool_choice tool) where the model would answer in text: well-formed by grammar.
  const forced = await client.messages.create({
    model, max_tokens: 64, messages: hello, tools, temperature: 1, tool_choice: { type: "tool", name: "get_weather" },
  });
  const forcedUse = forced.content.find((b) => b.type === "tool_use");
  assert.ok(forcedUse && typeof forcedUse.input.city === "string", JSON.stringify(forced.content));
  assert.strictEqual(forced.stop_reason, "tool_use");

  // Streaming: the SDK assembles the events into the same message; the events come in order.
  const stream = client.messages.stream({ model, max_tokens: 32, messages: hello, temperature: 0 });
  const types = [];
  let streamed = "";
  stream.on("streamEvent", (event) => types.push(event.type));
  stream.on("text", (text) => { streamed += text; });
  const final = await stream.finalMessage();
  assert.strictEqual(streamed, scenario.hello_reply);
  assert.strictEqual(textOf(final), scenario.hello_reply);
  assert.strictEqual(final.stop_reason, "end_turn");
  assert.strictEqual(types[0], "message_start");
  assert.strictEqual(types[types.length - 1], "message_stop");
  assert.strictEqual(types[types.length - 2], "message_delta");
  assert.ok(types.includes("content_block_start") && types.includes("content_block_delta") && types.includes("content_block_stop"));
  const toolStream = await client.messages.stream({ model, max_tokens: 64, messages: weather, tools, temperature: 0 }).finalMessage();
  assert.deepStrictEqual(toolStream.content.find((b) => b.type === "tool_use").input, { city: "Paris" });
  assert.strictEqual(toolStream.stop_reason, "tool_use");

  // Errors in Anthropic's shape, as the SDK's typed errors.
  await rejectsWith(client.messages.create({ model, max_tokens: 8, messages: [
    { role: "user", content: [{ type: "tool_result", tool_use_id: "toolu_none", content: "x" }] }] }), 400, /did not make/);
  await rejectsWith(client.messages.create({ model: "claude-opus-4", max_tokens: 8, messages: hello }), 404, /does not exist/);
  await rejectsWith(client.messages.create({ model, messages: hello }), 400, /max_tokens/);
  await rejectsWith(client.messages.create({ model, max_tokens: 8, messages: [{ role: "user", content: [
    { type: "image", source: { type: "url", url: "https://example.com/cat.png" } }] }] }), 400, /reads no URLs/);
  await rejectsWith(client.messages.create({ model, max_tokens: 8, messages: [{ role: "assistant", content: [
    { type: "tool_use", id: "t1", name: "get_weather", input: { city: "x".repeat(10 << 20) } }] }] }), 400, /exceeds/);
  await rejectsWith(client.messages.create({ model, max_tokens: 8, messages: [{ role: "user", content: [
    { type: "document", source: { type: "text", media_type: "text/plain", data: "x" } }] }] }), 400, /'document' block/);
  console.log("anthropic client: all checks passed");
}

main().catch((e) => {
  console.error("anthropic client: FAILED:", e);
  process.exit(1);
});
