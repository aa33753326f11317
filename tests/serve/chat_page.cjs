// Drives `hyla serve`'s chat page in headless Chromium (Debian's chromium, through puppeteer-core;
// run by tests/test_serve.cpp): type a message and see the streamed reply, attach an image, stop a
// generation, fold a reasoning, and save a screenshot for a reader.
//   node chat_page.cjs URL SCENARIO.json IMAGE.png SCREENSHOT.png
// Exits non-zero with a message on the first failed check.
const fs = require("fs");
const assert = require("assert");
const puppeteer = require("puppeteer-core");

const [url, scenarioPath, imagePath, screenshotPath] = process.argv.slice(2);
const scenario = JSON.parse(fs.readFileSync(scenarioPath, "utf8"));

async function main() {
  const browser = await puppeteer.launch({
    executablePath: process.env.CHROMIUM || "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
  });
  try {
    const page = await browser.newPage();
    const errors = [];
    page.on("pageerror", (e) => errors.push(e.message));
    page.on("console", (m) => { if (m.type() === "error") errors.push(m.text()); });
    await page.goto(url, { waitUntil: "networkidle0" });
    const idle = () => page.waitForFunction(() => !document.querySelector("#send").disabled && document.querySelector("#stop").disabled);
    const replies = async () => {
      const shown = await page.$$eval(".message.assistant .error", (els) => els.map((e) => e.textContent));
      assert.deepStrictEqual(shown, [], "errors shown in the conversation");
      return page.$$eval(".message.assistant .body", (els) => els.map((e) => e.textContent));
    };

    // A message, its streamed reply.
    await page.evaluate(() => {  // the settings, as a user sets them (the test server allows 256 tokens)
      document.querySelector("#temperature").value = "0";
      document.querySelector("#max_tokens").value = "64";
    });
    await page.type("#input", scenario.hello_messages[0].content);
    await page.keyboard.press("Enter");
    await idle();
    assert.deepStrictEqual(await replies(), [scenario.hello_reply]);
    assert.match(await page.$eval("#model", (e) => e.textContent), /hyla-test/);

    // An image, attached from a file, in a new conversation: the reply the model memorised for it.
    await page.click("#new-chat");
    const input = await page.$("#attach");
    await input.uploadFile(imagePath);
    await page.waitForSelector("#attachments img");
    await page.type("#input", scenario.image_cases[0].messages[0].content[0].text);
    await page.click("#send");
    await idle();
    assert.deepStrictEqual(await replies(), [scenario.image_cases[0].reply]);
    assert.strictEqual(await page.$$eval(".message.user img", (els) => els.length), 1);

    // Stop: the request is held back a moment so that Stop comes while the reply is awaited.
    let holding = true;
    await page.setRequestInterception(true);
    page.on("request", (request) => {
      if (!holding || !request.url().endsWith("/v1/chat/completions")) return request.continue();
      setTimeout(() => request.continue().catch(() => {}), 1500);  // aborted by then: refused, and ignored
    });
    await page.type("#input", "And now?");
    await page.click("#send");
    await page.waitForFunction(() => !document.querySelector("#stop").disabled);
    await page.click("#stop");
    await idle();
    assert.strictEqual(await page.$$eval(".message.assistant .error", (els) => els.length), 0, "a stop is no error");
    holding = false;

    // A reply's reasoning is folded, and opens on a click.
    await page.evaluate(() => {
      localStorage.setItem("hyla.conversations", JSON.stringify([{ id: "r", title: "Reasoned", messages: [
        { role: "user", content: "Why?" },
        { role: "assistant", content: "Because **it is**.\n\n```\ncode <b>\n```", reasoning: "Thinking it over." }] }]));
    });
    await page.reload({ waitUntil: "networkidle0" });
    assert.strictEqual(await page.$eval(".reasoning", (e) => e.open), false);
    await page.click(".reasoning summary");
    assert.strictEqual(await page.$eval(".reasoning", (e) => e.open), true);
    assert.strictEqual(await page.$eval(".message.assistant .body strong", (e) => e.textContent), "it is");
    assert.strictEqual(await page.$eval(".message.assistant .body pre code", (e) => e.textContent), "code <b>\n");

    await page.screenshot({ path: screenshotPath, fullPage: true });
    assert.deepStrictEqual(errors, [], "no errors in the page");
    console.log("chat page: all checks passed");
  } finally {
    await browser.close();
  }
}

main().catch((e) => {
  console.error("chat page: FAILED:", e);
  process.exit(1);
});
