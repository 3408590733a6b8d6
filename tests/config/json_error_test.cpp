// Malformed JSON is reported as source:line:column with the line and a caret.
#include "zero/config/json_error.h"

#include <cstdio>

#include "config_test_util.h"

namespace {

using zero::config::locate_offset;
using zero::config::parse_json;
using zero::config::TextPosition;
using zero::config::testing::error_of;

std::string parse_error(std::string_view text) {
  try {
    parse_json(text, "cfg.json");
  } catch (const zero::Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for: " << text;
  return "";
}

// "cfg.json:L:C: malformed JSON: ..." -> {L, C}
TextPosition reported(const std::string& message) {
  std::size_t line = 0, column = 0;
  int consumed = 0;
  if (std::sscanf(message.c_str(), "cfg.json:%zu:%zu: malformed JSON: %n", &line, &column,
                  &consumed) != 2 ||
      consumed == 0) {
    ADD_FAILURE() << "no position in: " << message;
    return {0, 0};
  }
  return {line, column};
}

TEST(LocateOffset, CountsLinesAndCharacters) {
  EXPECT_EQ(locate_offset("abc", 0), (TextPosition{1, 1}));
  EXPECT_EQ(locate_offset("abc", 2), (TextPosition{1, 3}));
  EXPECT_EQ(locate_offset("abc", 3), (TextPosition{1, 4}));
  EXPECT_EQ(locate_offset("abc", 99), (TextPosition{1, 4}));
  EXPECT_EQ(locate_offset("a\nbc", 1), (TextPosition{1, 2}));  // the newline ends line 1
  EXPECT_EQ(locate_offset("a\nbc", 2), (TextPosition{2, 1}));
  EXPECT_EQ(locate_offset("a\n\n\nbc", 5), (TextPosition{4, 2}));
  // "é" is two bytes and one column.
  EXPECT_EQ(locate_offset("\"\xC3\xA9\" x", 5), (TextPosition{1, 5}));
  // A byte-order mark takes no column.
  EXPECT_EQ(locate_offset("\xEF\xBB\xBFxy", 4), (TextPosition{1, 2}));
}

TEST(JsonError, TrailingCommaPointsAtTheBrace) {
  std::string e = parse_error("{\n  \"a\": 1,\n  \"b\": 2,\n}\n");
  EXPECT_EQ(reported(e), (TextPosition{4, 1})) << e;
  EXPECT_CONTAINS(e, "expected string literal");
  EXPECT_CONTAINS(e, "\n  }\n  ^");
}

TEST(JsonError, MissingCommaPointsAtTheNextKey) {
  std::string e = parse_error("{\n  \"lr\": 0.1\n  \"eps\": 1e-8\n}");
  // The parser reads the whole string token before it sees it is unexpected.
  EXPECT_EQ(reported(e), (TextPosition{3, 7})) << e;
  EXPECT_CONTAINS(e, "unexpected string literal; expected '}'");
  EXPECT_CONTAINS(e, "\n    \"eps\": 1e-8\n        ^");
}

TEST(JsonError, EndOfInput) {
  std::string e = parse_error("{\"a\": 1");
  EXPECT_EQ(reported(e), (TextPosition{1, 8})) << e;
  EXPECT_CONTAINS(e, "unexpected end of input");
  e = parse_error("");
  EXPECT_EQ(reported(e), (TextPosition{1, 1})) << e;
}

TEST(JsonError, NumberOverflowHasAPositionToo) {
  // nlohmann reports this one as out_of_range, without a byte position.
  std::string e = parse_error("{\n \"lr\": 1e999}");
  EXPECT_EQ(reported(e), (TextPosition{2, 12})) << e;  // its last digit
  EXPECT_CONTAINS(e, "number overflow parsing '1e999'");
}

TEST(JsonError, CommentsAreNotJson) {
  std::string e = parse_error("{ // lr\n \"lr\": 1}");
  EXPECT_EQ(reported(e).line, 1u) << e;
}

TEST(JsonError, AgreesWithNlohmannsOwnPosition) {
  // nlohmann's message carries its own byte-based line and column; for ASCII
  // text ours must agree.
  for (std::string_view text :
       {"{\"a\": [1, 2,, 3]}", "{\"a\": tru}", "\n\n   {\"x\" 1}", "[1, 2] 3", "{\"a\": \"\x01\"}",
        "{\"a\": -}", "{\n\"a\":\n\n\n{\"b\": [}}", "{\"a\": \"\\u12\"}", "  \n"}) {
    std::string ours = parse_error(text);
    std::string theirs;
    try {
      auto parsed = nlohmann::json::parse(text);
      (void)parsed;
    } catch (const nlohmann::json::parse_error& e) {
      theirs = e.what();
    }
    TextPosition want{0, 0};
    std::size_t at = theirs.find("line ");
    ASSERT_NE(at, std::string::npos) << theirs;
    ASSERT_EQ(std::sscanf(theirs.c_str() + at, "line %zu, column %zu", &want.line, &want.column), 2)
        << theirs;
    EXPECT_EQ(reported(ours), want) << text << "\nours: " << ours << "\ntheirs: " << theirs;
  }
}

TEST(JsonError, ColumnsCountCharactersAndTheExcerptIsValidUtf8) {
  std::string e = parse_error("{\"\xC3\xA9t\xC3\xA9\": x}");
  EXPECT_EQ(reported(e), (TextPosition{1, 9})) << e;
  // Invalid UTF-8 in the input is not copied into the message.
  e = parse_error("{\"a\": \"\xFF\xFE\"}");
  EXPECT_NO_THROW((void)nlohmann::json(e).dump()) << e;
  EXPECT_CONTAINS(e, "?");
}

TEST(JsonError, LongLinesAreCutAroundTheError) {
  std::string text = "{\"a\": \"" + std::string(500, 'x') + "\", \"b\": nope}";
  std::string e = parse_error(text);
  EXPECT_LT(e.size(), 400u) << e;
  EXPECT_CONTAINS(e, "...");
  // The caret sits under the offending character of the excerpt.
  std::size_t newline = e.find('\n');
  std::string line = e.substr(newline + 1, e.find('\n', newline + 1) - newline - 1);
  std::string caret = e.substr(e.rfind('\n') + 1);
  ASSERT_EQ(caret.back(), '^');
  EXPECT_EQ(line[caret.size() - 1], 'o') << line << "\n" << caret;
}

TEST(JsonError, ControlCharactersAreBlankedInTheExcerpt) {
  std::string e = parse_error("{\"a\":\t\"b\x01\"}");
  std::string excerpt = e.substr(e.find('\n') + 1);
  for (char c : excerpt) EXPECT_TRUE(c == '\n' || static_cast<unsigned char>(c) >= 0x20) << e;
}

TEST(JsonError, ParseConfigUsesTheSourceName) {
  std::string e = error_of("{\"train_batch_size\": 8,}");
  EXPECT_EQ(e.rfind("test.json:1:24: malformed JSON: ", 0), 0u) << e;
}

TEST(JsonError, DuplicateKeysAreRefusedWhereTheSecondIs) {
  // DeepSpeed refuses a config file with a key given twice in one object.
  EXPECT_EQ(parse_error("{\"a\": {\"b\": 1,\n       \"b\": 2}}"),
            "cfg.json:2:8: key 'a.b' is given twice in the same object (first at line 1, column 8): "
            "keep one of them (DeepSpeed refuses such a file too)\n"
            "         \"b\": 2}}\n"
            "         ^");
  std::string e = parse_error(R"({"c": [{"d": 1}, {"d": 2, "e": 1, "d": 3}]})");
  EXPECT_EQ(e.rfind("cfg.json:1:35: key 'c[1].d' is given twice in the same object (first at line 1, column 19)", 0),
            0u)
      << e;
  // An escaped quote in a key is not its start; the same key in sibling
  // objects, or as a value, is no duplicate.
  e = parse_error(R"({"x\"y": 1, "x\"y": 2})");
  EXPECT_EQ(e.rfind("cfg.json:1:13: key 'x\"y' is given twice in the same object (first at line 1, column 2)", 0), 0u)
      << e;
  e = parse_error(R"({"k\\": 1, "k\\": 2})");
  EXPECT_EQ(e.rfind("cfg.json:1:12: key 'k\\' is given twice", 0), 0u) << e;
  EXPECT_NO_THROW((void)parse_json(R"({"a": {"b": 1}, "c": {"b": 1}, "d": ["b", "b"], "b": "b"})", "cfg.json"));
}

TEST(JsonError, KeepsTheOrderOfTheFile) {
  auto j = parse_json(R"({"z": 1, "a": 2, "m": 3})", "cfg.json");
  std::string keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys += it.key();
  EXPECT_EQ(keys, "zam");
}

TEST(JsonError, DeepNestingIsNotACrash) {
  std::string deep = std::string(100000, '[') + std::string(100000, ']');
  EXPECT_NO_THROW((void)parse_json(deep, "cfg.json"));
  EXPECT_CONTAINS(error_of(deep), "expected a JSON object ({...}) at the top level, got [[[...]]]");
  std::string config = R"({"train_batch_size": 8, "zero_optimization": {"stage": )" +
                       std::string(100000, '[') + std::string(100000, ']') + "}}";
  EXPECT_CONTAINS(error_of(config), "zero_optimization.stage: expected an integer 0..3, got [[[...]]]");
}

}  // namespace
