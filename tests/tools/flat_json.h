// A strict reader of one flat JSON object ({"key": number | string | true | false | null,
// ...}) — what `flare bench --json` prints — so the tests check that machines can parse it —
// and the typed lookups the tests make in one.
#pragma once

#include <gtest/gtest.h>

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>

namespace flare::testing {

using JsonValue = std::variant<std::nullptr_t, bool, double, std::string>;
using JsonObject = std::map<std::string, JsonValue>;

namespace detail {

class FlatJsonReader {
 public:
  explicit FlatJsonReader(std::string_view text) : text_(text) {}

  std::optional<JsonObject> object() {
    JsonObject result;
    if (!consume('{')) return std::nullopt;
    if (consume('}')) return finish(result);
    do {
      std::optional<std::string> key = string();
      if (!key || !consume(':') || result.contains(*key)) return std::nullopt;
      std::optional<JsonValue> value = scalar();
      if (!value) return std::nullopt;
      result.emplace(std::move(*key), std::move(*value));
    } while (consume(','));
    if (!consume('}')) return std::nullopt;
    return finish(result);
  }

 private:
  std::optional<JsonObject> finish(JsonObject& result) {
    skip_space();
    if (pos_ != text_.size()) return std::nullopt;  // trailing garbage
    return std::move(result);
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  bool consume_word(std::string_view word) {
    skip_space();
    if (text_.substr(pos_, word.size()) != word) return false;
    pos_ += word.size();
    return true;
  }
  std::optional<std::string> string() {
    if (!consume('"')) return std::nullopt;
    std::string value;
    while (pos_ < text_.size() && text_[pos_] != '"') {
      char c = text_[pos_++];
      if (static_cast<unsigned char>(c) < 0x20) return std::nullopt;
      if (c == '\\') {
        if (pos_ >= text_.size()) return std::nullopt;
        c = text_[pos_++];
        if (c != '"' && c != '\\' && c != '/') return std::nullopt;  // enough for flare's keys
      }
      value += c;
    }
    if (pos_ >= text_.size()) return std::nullopt;
    ++pos_;
    return value;
  }
  std::optional<JsonValue> scalar() {
    skip_space();
    if (pos_ >= text_.size()) return std::nullopt;
    if (text_[pos_] == '"') {
      std::optional<std::string> text = string();
      if (!text) return std::nullopt;
      return JsonValue(std::move(*text));
    }
    if (consume_word("true")) return JsonValue(true);
    if (consume_word("false")) return JsonValue(false);
    if (consume_word("null")) return JsonValue(nullptr);
    // JSON numbers: -?digits(.digits)?([eE][+-]?digits)?, no leading '+', no nan/inf.
    const size_t start = pos_;
    if (text_[pos_] == '-') ++pos_;
    const auto digits = [&] {
      const size_t from = pos_;
      while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) ++pos_;
      return pos_ > from;
    };
    if (!digits()) return std::nullopt;
    if (pos_ < text_.size() && text_[pos_] == '.' && (++pos_, !digits())) return std::nullopt;
    if (pos_ < text_.size() && (text_[pos_] == 'e' || text_[pos_] == 'E')) {
      ++pos_;
      if (pos_ < text_.size() && (text_[pos_] == '+' || text_[pos_] == '-')) ++pos_;
      if (!digits()) return std::nullopt;
    }
    return JsonValue(std::strtod(std::string(text_.substr(start, pos_ - start)).c_str(), nullptr));
  }

  std::string_view text_;
  size_t pos_ = 0;
};

}  // namespace detail

// The object, or nullopt when `text` is anything but one flat JSON object (duplicate keys,
// nested values, NaN literals and trailing text are rejected).
inline std::optional<JsonObject> parse_flat_json(std::string_view text) {
  return detail::FlatJsonReader(text).object();
}

// The number (NaN and a test failure when missing or not a number) and the string (empty and a
// test failure likewise) at `key`.
inline double number(const JsonObject& json, const std::string& key) {
  const auto it = json.find(key);
  if (it == json.end() || !std::holds_alternative<double>(it->second)) {
    ADD_FAILURE() << "missing numeric key " << key;
    return std::nan("");
  }
  return std::get<double>(it->second);
}

inline std::string text(const JsonObject& json, const std::string& key) {
  const auto it = json.find(key);
  if (it == json.end() || !std::holds_alternative<std::string>(it->second)) {
    ADD_FAILURE() << "missing string key " << key;
    return "";
  }
  return std::get<std::string>(it->second);
}

}  // namespace flare::testing
