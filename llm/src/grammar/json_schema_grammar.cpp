// JSON Schema into GBNF (json_schema_grammar.h). Every schema node becomes a rule;
// $refs become references to the rule of their definition, which is how recursive
// schemas stay finite.
#include "tessera/json_schema_grammar.h"

#include <charconv>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "grammar/gbnf_pieces.h"
#include "tessera/grammar.h"

namespace tessera {

namespace {

using json = nlohmann::ordered_json;

// The generic JSON rules, written once and referred to by name.
constexpr const char* kJsonRules = R"(ws ::= "" | " " | "\n" [ \t]{0,20}
json-char ::= [^"\\\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4})
json-string ::= "\"" json-char* "\""
json-int ::= "-"? ("0" | [1-9] [0-9]{0,15})
json-frac ::= "." [0-9]{1,16}
json-exp ::= [eE] [-+]? [0-9]{1,3}
json-number ::= json-int json-frac? json-exp?
json-boolean ::= "true" | "false"
json-null ::= "null"
json-value ::= json-object | json-array | json-string | json-number | json-boolean | json-null
json-object ::= "{" ws (json-string ws ":" ws json-value ws ("," ws json-string ws ":" ws json-value ws)*)? "}"
json-array ::= "[" ws (json-value ws ("," ws json-value ws)*)? "]"
)";

[[noreturn]] void refuse(const std::string& what) { throw GrammarError("JSON schema: " + what); }

const std::set<std::string>& annotations() {
  static const std::set<std::string> k = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$defs",
                                          "definitions", "strict", "contentMediaType", "contentEncoding"};
  return k;
}

class SchemaConverter {
 public:
  SchemaConverter(const json& root, const std::string& rule, const JsonSchemaOptions& o)
      : root_(root), rule_(rule), strict_(o.strict) {}

  std::string convert() {
    const std::string top = visit(root_, rule_ + "-value");
    std::string out = rule_ + " ::= " + top + "\n";
    for (const auto& [name, body] : rules_) out += name + " ::= " + body + "\n";
    return out;
  }

 private:
  const json& root_;
  const std::string rule_;
  const bool strict_;
  std::map<std::string, std::string> rules_;
  std::map<std::string, std::string> ref_rules_;  // "$ref" target -> its rule

  std::string new_rule(const std::string& hint, const std::string& body) {
    std::string base;
    for (char c : hint) base += std::isalnum(static_cast<unsigned char>(c)) ? char(std::tolower(c)) : '-';
    if (base.empty()) base = "r";
    std::string name = base;
    for (int n = 2; rules_.count(name) || name.rfind("json-", 0) == 0 || name == "ws" || name == rule_; ++n)
      name = base + "-" + std::to_string(n);
    rules_[name] = body;
    return name;
  }

  // The rule (or a short expression) for one schema node.
  std::string visit(const json& s, const std::string& hint) {
    if (s.is_boolean()) {
      if (!s.get<bool>()) refuse("the schema 'false' matches nothing");
      return "json-value";
    }
    if (!s.is_object()) refuse("a schema must be an object or a boolean, got " + std::string(s.type_name()));
    for (const auto& [k, v] : s.items()) {
      static const std::set<std::string> known = {
          "type", "properties", "required", "additionalProperties", "items", "prefixItems", "minItems",
          "maxItems", "minLength", "maxLength", "pattern", "format", "minimum", "maximum", "exclusiveMinimum",
          "exclusiveMaximum", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"};
      if (!known.count(k) && !annotations().count(k) && strict_) refuse("the keyword '" + k + "' is not supported");
    }
    if (auto r = s.find("$ref"); r != s.end()) return ref(*r);
    if (auto e = s.find("enum"); e != s.end()) {
      if (!e->is_array() || e->empty()) refuse("'enum' must be a non-empty array");
      std::string body;
      for (const json& v : *e) body += (body.empty() ? "" : " | ") + gbnf_literal(v.dump());
      return new_rule(hint, body);
    }
    if (auto c = s.find("const"); c != s.end()) return new_rule(hint, gbnf_literal(c->dump()));
    for (const char* key : {"anyOf", "oneOf"}) {
      if (auto a = s.find(key); a != s.end()) {
        if (!a->is_array() || a->empty()) refuse("'" + std::string(key) + "' must be a non-empty array");
        std::string body;
        int i = 0;
        for (const json& sub : *a) body += (body.empty() ? "" : " | ") + visit(sub, hint + "-" + std::to_string(i++));
        return new_rule(hint, body);
      }
    }
    if (auto a = s.find("allOf"); a != s.end()) {
      if (!a->is_array() || a->size() != 1) refuse("'allOf' is supported with one schema only");
      return visit((*a)[0], hint);
    }
    auto t = s.find("type");
    if (t == s.end()) {
      if (s.contains("properties") || s.contains("additionalProperties")) return object(s, hint);
      if (s.contains("items") || s.contains("prefixItems")) return array(s, hint);
      return "json-value";
    }
    if (t->is_array()) {
      if (t->empty()) refuse("'type' must not be an empty array");
      std::string body;
      for (const json& one : *t) body += (body.empty() ? "" : " | ") + typed(s, one, hint);
      return new_rule(hint, body);
    }
    return typed(s, *t, hint);
  }

  std::string typed(const json& s, const json& type, const std::string& hint) {
    if (!type.is_string()) refuse("'type' must be a string or an array of strings");
    const std::string t = type.get<std::string>();
    if (t == "object") return object(s, hint);
    if (t == "array") return array(s, hint);
    if (t == "string") return string(s, hint);
    if (t == "integer") return number(s, hint, true);
    if (t == "number") return number(s, hint, false);
    if (t == "boolean") return "json-boolean";
    if (t == "null") return "json-null";
    refuse("the type '" + t + "' is not a JSON Schema type");
  }

  std::string ref(const json& r) {
    if (!r.is_string()) refuse("'$ref' must be a string");
    const std::string target = r.get<std::string>();
    if (auto it = ref_rules_.find(target); it != ref_rules_.end()) return it->second;
    const json* def = nullptr;
    std::string name;
    if (target == "#") {
      def = &root_;
      name = rule_ + "-value";
    } else {
      for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
        const std::string p = prefix;
        if (target.rfind(p, 0) == 0) {
          name = target.substr(p.size());
          const std::string section = p.substr(2, p.size() - 3);
          auto sec = root_.find(section);
          if (sec != root_.end() && sec->is_object() && sec->contains(name)) def = &(*sec)[name];
        }
      }
    }
    if (!def) refuse("'$ref' '" + target + "' does not name a definition of this schema (#, #/$defs/NAME)");
    // Named before it is visited, so that a reference inside it refers back.
    const std::string rule = new_rule(rule_ + "-ref-" + name, "");
    ref_rules_[target] = rule;
    rules_[rule] = visit(*def, name);
    return rule;
  }

  std::string object(const json& s, const std::string& hint) {
    std::vector<std::pair<std::string, std::string>> props;  // (key literal, value rule)
    std::set<std::string> required;
    if (auto r = s.find("required"); r != s.end()) {
      if (!r->is_array()) refuse("'required' must be an array of names");
      for (const json& n : *r) {
        if (!n.is_string()) refuse("'required' must be an array of names");
        required.insert(n.get<std::string>());
      }
    }
    std::vector<bool> is_required;
    if (auto p = s.find("properties"); p != s.end()) {
      if (!p->is_object()) refuse("'properties' must be an object");
      for (const auto& [name, sub] : p->items()) {
        props.emplace_back(gbnf_literal(json(name).dump()), visit(sub, hint + "-" + name));
        is_required.push_back(required.count(name) > 0);
        required.erase(name);
      }
    }
    if (!required.empty()) refuse("'required' names '" + *required.begin() + "', which 'properties' does not define");
    // additionalProperties: absent means none when there is a "properties" (even an
    // empty one: what structured output and tool parameters mean), any value otherwise.
    std::optional<std::string> extra;
    if (auto a = s.find("additionalProperties"); a != s.end()) {
      if (a->is_boolean()) {
        if (a->get<bool>()) extra = "json-value";
      } else {
        extra = visit(*a, hint + "-additional");
      }
    } else if (!s.contains("properties")) {
      extra = "json-value";
    }
    auto kv = [](const std::string& key, const std::string& value) { return key + " ws \":\" ws " + value; };
    // Properties in order: after_[i] follows when something was written before
    // property i, first_[i] when nothing was.
    const size_t n = props.size();
    std::string extra_rule;
    if (extra) extra_rule = new_rule(hint + "-extra", "(\",\" ws " + kv("json-string", *extra) + " ws)*");
    std::string after = extra ? extra_rule : "";
    std::string first = extra ? "(" + kv("json-string", *extra) + " ws " + extra_rule + ")?" : "";
    for (size_t i = n; i-- > 0;) {
      const std::string item = kv(props[i].first, props[i].second) + " ws";
      const std::string then = after.empty() ? "" : " " + after;
      const std::string a_body = is_required[i] ? "\",\" ws " + item + then : "(\",\" ws " + item + ")?" + then;
      const std::string f_body =
          is_required[i] ? item + then : item + then + " | " + (first.empty() ? std::string("\"\"") : first);
      after = new_rule(hint + "-after", a_body);
      first = new_rule(hint + "-first", f_body);
    }
    return new_rule(hint, "\"{\" ws " + (first.empty() ? std::string("") : first + " ") + "\"}\"");
  }

  std::string array(const json& s, const std::string& hint) {
    std::vector<std::string> prefix;
    if (auto p = s.find("prefixItems"); p != s.end()) {
      if (!p->is_array()) refuse("'prefixItems' must be an array of schemas");
      int i = 0;
      for (const json& sub : *p) prefix.push_back(visit(sub, hint + "-" + std::to_string(i++)));
    }
    std::string item = "json-value";
    bool more = true;
    if (auto it = s.find("items"); it != s.end()) {
      if (it->is_boolean() && !it->get<bool>()) more = false;
      else item = visit(*it, hint + "-item");
    }
    const size_t min = count(s, "minItems", 0);
    const size_t max = count(s, "maxItems", SIZE_MAX);
    if (max < min) refuse("'maxItems' is below 'minItems'");
    // Element k: the prefix's schema, then `item`.
    std::vector<std::string> elems;
    const size_t bound = more ? std::max(min, prefix.size()) : prefix.size();
    if (!more && min > prefix.size()) refuse("'minItems' asks for more items than 'prefixItems' allows");
    for (size_t k = 0; k < bound && k < max; ++k) elems.push_back(k < prefix.size() ? prefix[k] : item);
    if (more && elems.empty() && max > 0) elems.push_back(item);  // one optional item, the rest in the tail
    // elems[0..min) required, then optional ones up to max (or unbounded).
    std::string tail;  // what may follow the listed elements
    if (more && max == SIZE_MAX) tail = "(\",\" ws " + item + " ws)*";
    else if (more && max > elems.size()) tail = "(\",\" ws " + item + " ws){0," + std::to_string(max - elems.size()) + "}";
    std::string body;
    // Nested optionals for elements past min: (e_min (, e_min+1 (...)?)?)?
    std::string rest = tail;
    for (size_t k = elems.size(); k-- > 0;) {
      const std::string sep = k == 0 ? "" : "\",\" ws ";
      const std::string here = sep + elems[k] + " ws" + (rest.empty() ? "" : " " + rest);
      rest = k >= min ? "(" + here + ")?" : here;
    }
    body = "\"[\" ws " + (rest.empty() ? std::string("") : rest + " ") + "\"]\"";
    return new_rule(hint, body);
  }

  static size_t count(const json& s, const char* key, size_t absent) {
    auto it = s.find(key);
    if (it == s.end()) return absent;
    if (!it->is_number_integer() || it->get<int64_t>() < 0) refuse("'" + std::string(key) + "' must be an integer >= 0");
    const int64_t v = it->get<int64_t>();
    if (v > 4096) refuse("'" + std::string(key) + "' above 4096 is not supported");
    return size_t(v);
  }

  std::string string(const json& s, const std::string& hint) {
    const bool has_len = s.contains("minLength") || s.contains("maxLength");
    if (auto f = s.find("format"); f != s.end()) {
      if (!f->is_string()) refuse("'format' must be a string");
      if (s.contains("pattern") || has_len) refuse("'format' together with 'pattern' or lengths is not supported");
      const std::string body = format(f->get<std::string>(), strict_);
      if (body.empty()) return "json-string";
      return new_rule(hint, "\"\\\"\" " + body + " \"\\\"\"");
    }
    if (auto p = s.find("pattern"); p != s.end()) {
      if (!p->is_string()) refuse("'pattern' must be a string");
      if (has_len) refuse("'pattern' together with 'minLength' or 'maxLength' is not supported");
      std::string body;
      try {
        body = gbnf::regex(p->get<std::string>(), "json-char");
      } catch (const GrammarError&) {
        if (strict_) throw;
        return "json-string";  // not regular: not enforced
      }
      return new_rule(hint, "\"\\\"\" " + body + " \"\\\"\"");
    }
    if (!has_len) return "json-string";
    const size_t min = count(s, "minLength", 0), max = count(s, "maxLength", SIZE_MAX);
    if (max < min) refuse("'maxLength' is below 'minLength'");
    const std::string reps = max == SIZE_MAX ? "{" + std::to_string(min) + ",}"
                                             : "{" + std::to_string(min) + "," + std::to_string(max) + "}";
    return new_rule(hint, "\"\\\"\" json-char" + reps + " \"\\\"\"");
  }

  // The grammar of a format's text; empty when not strict and the format is unknown.
  static std::string format(const std::string& f, bool strict) {
    const std::string date = R"([0-9]{4} "-" ("0" [1-9] | "1" [0-2]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]))";
    const std::string time =
        R"(([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ("." [0-9]{1,9})? ("Z" | [+-] ([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9]))";
    if (f == "date") return "(" + date + ")";
    if (f == "time") return "(" + time + ")";
    if (f == "date-time") return "(" + date + " \"T\" " + time + ")";
    if (f == "uuid")
      return R"(([0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}))";
    if (!strict) return "";
    refuse("the string format '" + f + "' is not supported (date, time, date-time, uuid are)");
  }

  // Numbers have at most 16 integer digits (json-int): a bound past them is no bound
  // at all on its open side, and leaves nothing on the other.
  static constexpr double kBeyond = 1e16;

  std::string number(const json& s, const std::string& hint, bool integer) {
    if (integer) {
      std::optional<int64_t> lo, hi;
      // Fractional bounds of an integer round inwards; a bound past kBeyond is never
      // converted to int64.
      bool empty = false;
      // The bound of `key` on the lower side (sign 1) or the upper (sign -1, the lower
      // side's rule on the negated value), kept in b if stricter.
      auto bound = [&](const char* key, bool exclusive, int sign, std::optional<int64_t>& b) {
        auto it = s.find(key);
        if (it == s.end() || !it->is_number()) return;
        const double d = sign * it->get<double>();
        const double v = exclusive ? std::floor(d) + 1 : std::ceil(d);
        if (v <= -kBeyond) return;
        if (v >= kBeyond) {
          empty = true;
          return;
        }
        const int64_t x = sign * int64_t(v);
        b = !b ? x : sign > 0 ? std::max(*b, x) : std::min(*b, x);
      };
      bound("minimum", false, 1, lo);
      bound("maximum", false, -1, hi);
      bound("exclusiveMinimum", true, 1, lo);
      bound("exclusiveMaximum", true, -1, hi);
      for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})
        if (s.contains(k) && !s[k].is_number()) refuse("'" + std::string(k) + "' must be a number");
      if (empty) refuse("the integer bounds leave no value");
      if (!lo && !hi) return "json-int";
      return new_rule(hint, gbnf::integer_range(lo, hi));
    }
    // The stricter of minimum and exclusiveMinimum (and of the two maxima) applies.
    Bound lo = decimal_bound(s, "minimum", false), hi = decimal_bound(s, "maximum", false);
    if (Bound x = decimal_bound(s, "exclusiveMinimum", true); x.set && (!lo.set || x.value >= lo.value)) lo = x;
    if (Bound x = decimal_bound(s, "exclusiveMaximum", true); x.set && (!hi.set || x.value <= hi.value)) hi = x;
    if (lo.set && lo.value <= -kBeyond) lo.set = false;
    if (hi.set && hi.value >= kBeyond) hi.set = false;
    if ((lo.set && lo.value >= kBeyond) || (hi.set && hi.value <= -kBeyond)) refuse("the number bounds leave no value");
    if (!lo.set && !hi.set) return "json-number";
    return new_rule(hint, gbnf::number_range(lo.set ? std::optional(lo.text) : std::nullopt,
                                             hi.set ? std::optional(hi.text) : std::nullopt));
  }

  // A number's bound: its value and its decimal text (the shortest that reads back as
  // the same double).
  struct Bound {
    bool set = false;
    double value = 0;
    gbnf::DecimalBound text;
  };
  Bound decimal_bound(const json& s, const char* key, bool exclusive) const {
    Bound b;
    auto it = s.find(key);
    if (it == s.end()) return b;
    if (!it->is_number()) refuse("'" + std::string(key) + "' must be a number");
    const double v = it->get<double>();
    if (!std::isfinite(v)) refuse("'" + std::string(key) + "' must be finite");
    b.set = true;
    b.value = v;
    b.text.exclusive = exclusive;
    if (std::fabs(v) >= 1e16) return b;  // the caller drops or refuses it
    b.text.negative = v < 0;
    if (it->is_number_integer()) {
      const int64_t i = it->get<int64_t>();
      b.text.whole = i < 0 ? uint64_t(-(i + 1)) + 1 : uint64_t(i);
      return b;
    }
    char buf[1200];
    const auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(v), std::chars_format::fixed);
    const std::string text(buf, r.ec == std::errc() ? r.ptr : buf);
    const size_t dot = text.find('.');
    b.text.whole = std::stoull(text.substr(0, dot));
    if (dot != std::string::npos) b.text.frac = text.substr(dot + 1);
    return b;
  }
};

}  // namespace

std::string json_schema_rules(std::string_view schema_json, const std::string& rule, const JsonSchemaOptions& o) {
  json schema;
  try {
    schema = json::parse(schema_json);
  } catch (const json::exception& e) {
    throw GrammarError(std::string("JSON schema: not valid JSON: ") + e.what());
  }
  return SchemaConverter(schema, rule, o).convert();
}

std::string json_schema_to_gbnf(std::string_view schema_json, const JsonSchemaOptions& o) {
  return json_schema_rules(schema_json, "root", o) + kJsonRules;
}

const std::string& json_common_gbnf() {
  static const std::string k = kJsonRules;
  return k;
}

std::string json_object_gbnf() { return std::string("root ::= json-object\n") + kJsonRules; }

}  // namespace tessera
