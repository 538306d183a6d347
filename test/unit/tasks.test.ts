import { describe, expect, it } from "vitest";
import { additionReward, createAdditionTask } from "../../actors/environment/tasks/addition.ts";
import type { Task } from "../../actors/environment/task.ts";
import { createGuessNumberTask } from "../../actors/environment/tasks/guess-number.ts";
import { decodeBytes, encodeBytes, BOS_ID } from "../../src/engine/tokenizer.ts";

/** The secret number of a guess-number episode. */
const secretOf = (task: Task, index: number) => (task.reset(index, 1).state as { secret: number }).secret;

describe("built-in tasks", () => {
  it("addition: deterministic prompts, exact answer scores 1, shaped partial credit below 1", () => {
    const task = createAdditionTask({ digits: 2 });
    const a = task.reset(3, 42);
    const b = task.reset(3, 42);
    expect(a.prompt).toBe(b.prompt);
    expect(a.promptIds[0]).toBe(BOS_ID);
    expect(decodeBytes(a.promptIds)).toBe(a.prompt);
    const [x, y] = a.prompt.slice(0, -1).split("+").map(Number) as [number, number];
    const done = task.step(a.state, encodeBytes(String(x + y)));
    expect(done.done).toBe(true);
    expect(task.reward(done.state)).toBe(1);
    expect(additionReward("46", "45", true)).toBeGreaterThan(additionReward("46", "x", true));
    expect(additionReward("46", "45", true)).toBeLessThan(1);
    expect(additionReward("46", "45", false)).toBe(0);
    expect(() => createAdditionTask({ digits: 9 })).toThrow(/digits must be/);
  });

  it("addition, last-digit answers: one token, 1 for the sum's last digit, 0 otherwise", () => {
    const task = createAdditionTask({ digits: 1, answer: "last-digit" });
    expect(task.maxTurnTokens).toBe(1);
    for (let i = 0; i < 20; i++) {
      const ep = task.reset(i, 7);
      const [x, y] = ep.prompt.slice(0, -1).split("+").map(Number) as [number, number];
      expect(ep.prompt).toBe(`${x}+${y}=`);
      const right = String((x + y) % 10), wrong = String((x + y + 1) % 10);
      expect(task.reward(task.step(ep.state, encodeBytes(right)).state)).toBe(1);
      expect(task.success!(task.step(ep.state, encodeBytes(right)).state)).toBe(true);
      expect(task.reward(task.step(ep.state, encodeBytes(wrong)).state)).toBe(0);
      expect(task.success!(task.step(ep.state, encodeBytes(wrong)).state)).toBe(false);
    }
    expect(() => createAdditionTask({ answer: "first-digit" })).toThrow(/answer must be/);
  });

  it("addition, padded answers: the zero-padded sum in digits + 1 tokens, half a point for the right places", () => {
    const task = createAdditionTask({ digits: 1, answer: "padded" });
    expect(task.maxTurnTokens).toBe(2);
    for (let i = 0; i < 20; i++) {
      const ep = task.reset(i, 3);
      const [x, y] = ep.prompt.slice(0, -1).split("+").map(Number) as [number, number];
      const right = String(x + y).padStart(2, "0");
      const state = task.step(ep.state, encodeBytes(right)).state;
      expect([task.reward(state), task.success!(state)]).toEqual([1, true]);
      const oneOff = right[0] + String((Number(right[1]) + 1) % 10); // tens right, units wrong
      expect(task.reward(task.step(ep.state, encodeBytes(oneOff)).state)).toBe(0.25);
      expect(task.success!(task.step(ep.state, encodeBytes(oneOff)).state)).toBe(false);
    }
    const exact = createAdditionTask({ digits: 1, answer: "padded", shaped: false });
    const ep = exact.reset(0, 3);
    expect(exact.reward(exact.step(ep.state, encodeBytes("xx")).state)).toBe(0);
  });

  it("guess-number: replies higher/lower as environment tokens and rewards fewer turns", () => {
    const task = createGuessNumberTask({ max: 16, maxTurns: 6 });
    const ep = task.reset(0, 1);
    let state = ep.state;
    let lo = 1, hi = 16, turns = 0;
    for (;;) {
      const g = Math.floor((lo + hi) / 2);
      const r = task.step(state, encodeBytes(String(g)));
      state = r.state;
      turns++;
      if (r.done) break;
      const reply = decodeBytes(r.observation);
      if (reply.includes("higher")) lo = g + 1;
      else hi = g - 1;
    }
    expect(task.reward(state)).toBeCloseTo(1 - 0.1 * (turns - 1), 9);
    expect(task.success!(state)).toBe(true);
    const never = task.reset(0, 1);
    let s2 = never.state;
    for (let i = 0; i < 6; i++) s2 = task.step(s2, encodeBytes("x")).state;
    expect(task.reward(s2)).toBe(0);
    expect(task.success!(s2)).toBe(false);
  });

  it("guess-number, shaped: an unfound number earns credit only for guesses the replies so far allowed", () => {
    const play = (task: ReturnType<typeof createGuessNumberTask>, guesses: string[]) => {
      let i = 0;
      while (secretOf(task, i) !== 10) i++; // an episode whose secret is 10
      let s = task.reset(i, 1).state;
      for (const g of guesses) s = task.step(s, encodeBytes(g)).state;
      return [task.reward(s), task.success!(s)];
    };
    const shaped = createGuessNumberTask({ max: 16, maxTurns: 4 });
    // 4 and 12 were allowed; 3 (below the 5 that "higher" left) and 13 (above 11) were not
    expect(play(shaped, ["4", "12", "3", "13"])).toEqual([(0.3 * 2) / 4, false]);
    expect(play(shaped, ["10"])).toEqual([1, true]);
    expect(play(createGuessNumberTask({ max: 16, maxTurns: 4, shaped: false }), ["4", "12", "11", "9"])).toEqual([0, false]);
  });

  it("guess-number, information credit: an unfound number earns more for guesses that narrowed the interval more", () => {
    const task = createGuessNumberTask({ max: 16, maxTurns: 2, credit: "information" });
    const play = (guesses: string[]) => {
      let i = 0;
      while (secretOf(task, i) !== 10) i++;
      let s = task.reset(i, 1).state;
      for (const g of guesses) s = task.step(s, encodeBytes(g)).state;
      return task.reward(s);
    };
    // 8 then 12 leave 9-11 (3 numbers); 1 then 2 leave 3-16 (14); nonsense leaves all 16
    expect(play(["8", "12"])).toBeCloseTo((0.4 * Math.log2(16 / 3)) / 4, 12);
    expect(play(["1", "2"])).toBeCloseTo((0.4 * Math.log2(16 / 14)) / 4, 12);
    expect(play(["x", "y"])).toBe(0);
    expect(play(["10"])).toBe(1);
    expect(() => createGuessNumberTask({ credit: "warmer" })).toThrow(/credit must be/);
  });

  it("guess-number, turnRewards: each turn reports the credit it added; they sum to the unfound reward; the total reward is unchanged", () => {
    const play = (turnRewards: boolean, guesses: string[]) => {
      const task = createGuessNumberTask({ max: 16, maxTurns: 3, credit: "information", turnRewards });
      let i = 0;
      while (secretOf(task, i) !== 10) i++;
      let s = task.reset(i, 1).state;
      const per: (number | undefined)[] = [];
      for (const g of guesses) {
        const r = task.step(s, encodeBytes(g));
        per.push(r.reward);
        s = r.state;
      }
      return { per, reward: task.reward(s) };
    };
    const on = play(true, ["8", "12", "9"]), off = play(false, ["8", "12", "9"]);
    expect(off.per).toEqual([undefined, undefined, undefined]);
    expect(on.reward).toBe(off.reward);
    expect(on.per[0]).toBeCloseTo((0.4 * Math.log2(16 / 8)) / 4, 12); // 8 → 9-16
    expect(on.per.reduce((a, b) => a! + b!, 0)).toBeCloseTo(on.reward, 12);
    const found = play(true, ["8", "10"]);
    expect(found.reward).toBeCloseTo(0.9, 12);
    expect(found.per[1]).toBe(0); // the find itself is paid at the end (the remainder)
  });

  it("guess-number, interval replies: each reply names the numbers still possible, in the prompt's form", () => {
    const task = createGuessNumberTask({ max: 16, maxTurns: 6, replies: "interval" });
    let i = 0;
    while (secretOf(task, i) !== 10) i++;
    const ep = task.reset(i, 1);
    expect(ep.prompt).toBe("guess 1-16:");
    let s = ep.state;
    const seen: string[] = [];
    for (const g of ["8", "12", "x", "10"]) {
      const r = task.step(s, encodeBytes(g));
      s = r.state;
      seen.push(decodeBytes(r.observation));
    }
    expect(seen).toEqual([" higher 9-16:", " lower 9-11:", " number? 9-11:", " correct\n"]);
    expect([task.reward(s), task.success!(s)]).toEqual([0.7, true]);
    expect(() => createGuessNumberTask({ replies: "colder" })).toThrow(/replies must be/);
  });
});
