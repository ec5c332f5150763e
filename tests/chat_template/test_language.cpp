// The template language piece by piece. The expected strings were produced by Jinja2
// 3.1 configured as Hugging Face's apply_chat_template configures it (sandboxed,
// trim_blocks, lstrip_blocks, loopcontrols, its tojson), so each test pins the
// interpreter to the reference's behaviour, not to our reading of it.
#include <gtest/gtest.h>

#include <functional>

#include <nlohmann/json.hpp>

#include "tessera/chat_template.h"

namespace {

using ojson = nlohmann::ordered_json;

// Renders src with vars (JSON text); strftime_now sees 2024-07-26 09:05:03.
std::string R(const std::string& src, const std::string& vars) {
  tessera::RenderOptions o;
  std::tm t{};
  t.tm_year = 124;
  t.tm_mon = 6;
  t.tm_mday = 26;
  t.tm_hour = 9;
  t.tm_min = 5;
  t.tm_sec = 3;
  o.now = t;
  return tessera::ChatTemplate(src).render(ojson::parse(vars), o);
}

// The error's message (what Python prints after "SomeError: "), or a note that it rendered.
std::string error_of(const std::function<std::string()>& f) {
  try {
    return "(rendered) " + f();
  } catch (const tessera::ChatTemplateError& e) {
    return e.detail();
  }
}
#define EXPECT_ERR(expr, msg) EXPECT_EQ(error_of([&] { return expr; }), msg)

TEST(ChatTemplateLanguage, WsDash) {
  EXPECT_EQ(R("a  {%- if true -%}  b  {%- endif -%}  c", "{}"), "abc") << "ws_dash";
}

TEST(ChatTemplateLanguage, WsVarDash) {
  EXPECT_EQ(R("a  {{- 'x' -}}  b {{ 'y' }} c", "{}"), "axb y c") << "ws_var_dash";
}

TEST(ChatTemplateLanguage, TrimBlocks) {
  EXPECT_EQ(R("{% if true %}\nx\n{% endif %}\ny", "{}"), "x\ny") << "trim_blocks";
}

TEST(ChatTemplateLanguage, LstripBlocks) {
  EXPECT_EQ(R("    {% if true %}\n    x\n    {% endif %}\n  {{ 'v' }}", "{}"), "    x\n  v") << "lstrip_blocks";
}

TEST(ChatTemplateLanguage, LstripPlus) {
  EXPECT_EQ(R("    {%+ if true %}x{% endif %}", "{}"), "    x") << "lstrip_plus";
}

TEST(ChatTemplateLanguage, TrimPlus) {
  EXPECT_EQ(R("{% if true +%}\nx{% endif %}", "{}"), "\nx") << "trim_plus";
}

TEST(ChatTemplateLanguage, CommentWs) {
  EXPECT_EQ(R("a\n  {# comment #}\nb {#- c -#} d", "{}"), "a\nbd") << "comment_ws";
}

TEST(ChatTemplateLanguage, Raw) {
  EXPECT_EQ(R("{% raw %}{{ not parsed }}{% endraw %}", "{}"), "{{ not parsed }}") << "raw";
}

TEST(ChatTemplateLanguage, TrailingNewline) {
  EXPECT_EQ(R("x\n", "{}"), "x") << "trailing_newline";
}

TEST(ChatTemplateLanguage, Literals) {
  EXPECT_EQ(R("{{ 'it\\'s' }}|{{ \"tab\\there\" }}|{{ '\\u00e9\\x41' }}|{{ 'a' 'b' }}|{{ 1_000 }}|{{ 0x1F }}|{{ 1.5e3 }}|{{ True }}{{ false }}{{ none }}{{ None }}", "{}"), "it's|tab\there|éA|ab|1000|31|1500.0|TrueFalseNoneNone") << "literals";
}

TEST(ChatTemplateLanguage, ReprPrint) {
  EXPECT_EQ(R("{{ [1, 'a', none, 1.5, true, {'k': [1, 2]}, ('t',), \"it's\"] }}|{{ {'a': 'b'} }}|{{ 1.0 }}|{{ 1e16 }}|{{ 0.0001 }}|{{ 1e-5 }}|{{ -0.0 }}", "{}"), "[1, 'a', None, 1.5, True, {'k': [1, 2]}, ('t',), \"it's\"]|{'a': 'b'}|1.0|1e+16|0.0001|1e-05|-0.0") << "repr_print";
}

TEST(ChatTemplateLanguage, Arith) {
  EXPECT_EQ(R("{{ 7 // 2 }} {{ -7 // 2 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 10 - 2 - 3 }} {{ 1 + 1.5 }} {{ 'ab' * 3 }} {{ [1] * 2 }} {{ 7.5 // 2 }} {{ 7.5 % 2 }}", "{}"), "3 -4 2 -2 3.5 1024 0.5 7 9 4 5 2.5 ababab [1, 1] 3.0 1.5") << "arith";
}

TEST(ChatTemplateLanguage, Concat) {
  EXPECT_EQ(R("{{ 1 ~ 'a' ~ none ~ undefined_thing ~ [1] }}", "{}"), "1aNone[1]") << "concat";
}

TEST(ChatTemplateLanguage, PrecedenceFilter) {
  EXPECT_EQ(R("{{ 'a' + 'b' | upper }}|{{ -3 | abs }}|{{ not x is defined }}|{{ 1 + 2 is odd }}", "{}"), "aB|3|True|1") << "precedence_filter";
}

TEST(ChatTemplateLanguage, Compare) {
  EXPECT_EQ(R("{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 'x' in 'xyz' }} {{ 2 not in [1, 3] }} {{ 'k' in {'k': 1} }} {{ none == none }} {{ [1] == (1,) }}", "{}"), "True False True True True True True True True True False") << "compare";
}

TEST(ChatTemplateLanguage, AndOr) {
  EXPECT_EQ(R("{{ 0 or 'b' }}|{{ 'a' and 'b' }}|{{ '' and 'b' }}|{{ none or [] }}|{{ not 0 }}", "{}"), "b|b||[]|True") << "and_or";
}

TEST(ChatTemplateLanguage, Condexpr) {
  EXPECT_EQ(R("{{ 'y' if 1 else 'n' }}|{{ 'y' if 0 else 'n' }}|{{ 'y' if 0 }}|{{ ('a' if false else 'b') ~ 'c' }}", "{}"), "y|n||bc") << "condexpr";
}

TEST(ChatTemplateLanguage, Slicing) {
  EXPECT_EQ(R("{% set l = [0, 1, 2, 3, 4, 5] %}{{ l[::-1] }} {{ l[1:] }} {{ l[:-1] }} {{ l[-2:] }} {{ l[::2] }} {{ l[5:1:-2] }} {{ l[-1] }} {{ l[10:] }} {{ l[1:4:-1] }} {{ l[-100:2] }}", "{}"), "[5, 4, 3, 2, 1, 0] [1, 2, 3, 4, 5] [0, 1, 2, 3, 4] [4, 5] [0, 2, 4] [5, 3] 5 [] [] [0, 1]") << "slicing";
}

TEST(ChatTemplateLanguage, SlicingStr) {
  EXPECT_EQ(R("{% set s = 'héllo wörld' %}{{ s[::-1] }}|{{ s[1:4] }}|{{ s[-5:] }}|{{ s[0] }}|{{ s[-1] }}|{{ s|length }}|{{ s[::3] }}", "{}"), "dlröw olléh|éll|wörld|h|d|11|hlwl") << "slicing_str";
}

TEST(ChatTemplateLanguage, SlicingTupleMessages) {
  EXPECT_EQ(R("{% for m in messages[::-1] %}{{ m.role }}{% endfor %}|{% for m in messages[1:] %}{{ m['role'] }}{% endfor %}", "{\"messages\": [{\"role\": \"a\"}, {\"role\": \"b\"}, {\"role\": \"c\"}]}"), "cba|bc") << "slicing_tuple_messages";
}

TEST(ChatTemplateLanguage, Namespace) {
  EXPECT_EQ(R("{% set ns = namespace(count=0, found=false) %}{% for i in range(5) %}{% set ns.count = ns.count + i %}{% if i == 3 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.missing is defined }}", "{}"), "10 True False") << "namespace";
}

TEST(ChatTemplateLanguage, SetScopeLoop) {
  EXPECT_EQ(R("{% set x = 0 %}{% for i in range(3) %}{% set x = x + 1 %}{{ x }}{% endfor %}{{ x }}", "{}"), "1110") << "set_scope_loop";
}

TEST(ChatTemplateLanguage, SetScopeIf) {
  EXPECT_EQ(R("{% if true %}{% set y = 'inner' %}{% endif %}{{ y }}", "{}"), "inner") << "set_scope_if";
}

TEST(ChatTemplateLanguage, SetTuple) {
  EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set c = 3, 4 %}{{ c }}", "{}"), "12(3, 4)") << "set_tuple";
}

TEST(ChatTemplateLanguage, SetBlock) {
  EXPECT_EQ(R("{% set body %}Hello {{ 'World' }}!{% endset %}{{ body | upper }}|{% set t | trim %}   padded   {% endset %}[{{ t }}]", "{}"), "HELLO WORLD!|[padded]") << "set_block";
}

TEST(ChatTemplateLanguage, LoopVars) {
  EXPECT_EQ(R("{% for x in ['a', 'b', 'c'] %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }};{% endfor %}", "{}"), "1032TrueFalse3b;2121FalseFalse3ac;3210FalseTrue3b;") << "loop_vars";
}

TEST(ChatTemplateLanguage, LoopElse) {
  EXPECT_EQ(R("{% for x in [] %}{{ x }}{% else %}empty{% endfor %}|{% for x in [1] %}{{ x }}{% else %}empty{% endfor %}", "{}"), "empty|1") << "loop_else";
}

TEST(ChatTemplateLanguage, LoopFilter) {
  EXPECT_EQ(R("{% for x in range(10) if x is odd %}{{ x }}{{ '/' ~ loop.length if loop.last }},{% endfor %}", "{}"), "1,3,5,7,9/5,") << "loop_filter";
}

TEST(ChatTemplateLanguage, LoopBreakContinue) {
  EXPECT_EQ(R("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}{{ x }}{% endfor %}", "{}"), "0134") << "loop_break_continue";
}

TEST(ChatTemplateLanguage, LoopNested) {
  EXPECT_EQ(R("{% for a in [1, 2] %}{% for b in ['x', 'y'] %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }} {% endfor %}", "{}"), "1x11y21 2x12y22 ") << "loop_nested";
}

TEST(ChatTemplateLanguage, LoopDict) {
  EXPECT_EQ(R("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}{% for k, v in {'p': 3}|items %}{{ k }}{{ v }}{% endfor %}", "{}"), "a=1;b=2;xyp3") << "loop_dict";
}

TEST(ChatTemplateLanguage, LoopString) {
  EXPECT_EQ(R("{% for c in 'añb' %}[{{ c }}]{% endfor %}", "{}"), "[a][ñ][b]") << "loop_string";
}

TEST(ChatTemplateLanguage, LoopCycleChanged) {
  EXPECT_EQ(R("{% for x in [1, 1, 2, 3, 3] %}{{ loop.cycle('o', 'e') }}{% if loop.changed(x) %}{{ x }}{% endif %}{% endfor %}", "{}"), "o1eo2e3o") << "loop_cycle_changed";
}

TEST(ChatTemplateLanguage, LoopRecursive) {
  EXPECT_EQ(R("{% for item in [{'n': 'a', 'c': [{'n': 'b', 'c': []}, {'n': 'c', 'c': [{'n': 'd', 'c': []}]}]}] recursive %}{{ item.n }}{{ loop.depth }}({{ loop(item.c) }}){% endfor %}", "{}"), "a1(b2()c2(d3()))") << "loop_recursive";
}

TEST(ChatTemplateLanguage, MacroBasic) {
  EXPECT_EQ(R("{% macro greet(name, greeting='Hello', punct='!') %}{{ greeting }}, {{ name }}{{ punct }}{% endmacro %}{{ greet('Ann') }}|{{ greet('Bob', 'Hi') }}|{{ greet(name='Cy', punct='?') }}|{{ greet() }}", "{}"), "Hello, Ann!|Hi, Bob!|Hello, Cy?|Hello, !") << "macro_basic";
}

TEST(ChatTemplateLanguage, MacroRecursive) {
  EXPECT_EQ(R("{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", "{}"), "120") << "macro_recursive";
}

TEST(ChatTemplateLanguage, MacroCaller) {
  EXPECT_EQ(R("{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}inside {{ 1 + 1 }}{% endcall %}", "{}"), "<b>inside 2</b>") << "macro_caller";
}

TEST(ChatTemplateLanguage, MacroCallerArgs) {
  EXPECT_EQ(R("{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}{% call(x) each([1, 2]) %}[{{ x }}]{% endcall %}", "{}"), "[1][2]") << "macro_caller_args";
}

TEST(ChatTemplateLanguage, MacroVarargsKwargs) {
  EXPECT_EQ(R("{% macro m(a) %}{{ a }}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, k='v') }}", "{}"), "1(2, 3){'k': 'v'}") << "macro_varargs_kwargs";
}

TEST(ChatTemplateLanguage, MacroScope) {
  EXPECT_EQ(R("{% set outer = 'o' %}{% macro m() %}{% set outer = 'changed' %}{{ outer }}{% endmacro %}{{ m() }}{{ outer }}", "{}"), "changedo") << "macro_scope";
}

TEST(ChatTemplateLanguage, MacroTrim) {
  EXPECT_EQ(R("{%- macro line(x) -%}\n    [{{ x }}]\n{%- endmacro -%}\n{{ line(1) | trim }}{{ line(2) }}", "{}"), "[1][2]") << "macro_trim";
}

TEST(ChatTemplateLanguage, FilterBlock) {
  EXPECT_EQ(R("{% filter upper %}shout {{ 'this' }}{% endfilter %}|{% filter replace('a', 'o') | capitalize %}banana{% endfilter %}", "{}"), "SHOUT THIS|Bonono") << "filter_block";
}

TEST(ChatTemplateLanguage, WithBlock) {
  EXPECT_EQ(R("{% set x = 1 %}{% with x = 2, y = x %}{{ x }}{{ y }}{% endwith %}{{ x }}", "{}"), "211") << "with_block";
}

TEST(ChatTemplateLanguage, TojsonBasic) {
  EXPECT_EQ(R("{{ d | tojson }}|{{ d | tojson(indent=2) }}|{{ d | tojson(sort_keys=true) }}|{{ d | tojson(separators=(',', ':')) }}|{{ d.a | tojson(ensure_ascii=true) }}|{{ [] | tojson(indent=2) }}|{{ {} | tojson }}|{{ 'x' | tojson }}", "{\"d\": {\"b\": [1, 2.5, null, true], \"a\": \"Grüße, 世界! 🌍 \\\"q\\\" <t> & \\n\\t\\u0001\"}}"), "{\"b\": [1, 2.5, null, true], \"a\": \"Grüße, 世界! 🌍 \\\"q\\\" <t> & \\n\\t\\u0001\"}|{\n  \"b\": [\n    1,\n    2.5,\n    null,\n    true\n  ],\n  \"a\": \"Grüße, 世界! 🌍 \\\"q\\\" <t> & \\n\\t\\u0001\"\n}|{\"a\": \"Grüße, 世界! 🌍 \\\"q\\\" <t> & \\n\\t\\u0001\", \"b\": [1, 2.5, null, true]}|{\"b\":[1,2.5,null,true],\"a\":\"Grüße, 世界! 🌍 \\\"q\\\" <t> & \\n\\t\\u0001\"}|\"Gr\\u00fc\\u00dfe, \\u4e16\\u754c! \\ud83c\\udf0d \\\"q\\\" <t> & \\n\\t\\u0001\"|[]|{}|\"x\"") << "tojson_basic";
}

TEST(ChatTemplateLanguage, TojsonNestedIndent) {
  EXPECT_EQ(R("{{ {'a': {'b': [1, {'c': []}]}, 'd': 1.0} | tojson(indent=4) }}|{{ [1,[2]] | tojson(indent='\\t') }}|{{ {1: 'int key', none: 'n', true: 't'} | tojson }}", "{}"), "{\n    \"a\": {\n        \"b\": [\n            1,\n            {\n                \"c\": []\n            }\n        ]\n    },\n    \"d\": 1.0\n}|[\n\t1,\n\t[\n\t\t2\n\t]\n]|{\"1\": \"t\", \"null\": \"n\"}") << "tojson_nested_indent";
}

TEST(ChatTemplateLanguage, TojsonUndefined) {
  // tojson_undefined: TypeError: Object of type Undefined is not JSON serializable
  EXPECT_ERR(R("{{ nothing | tojson }}", "{}"), "Object of type Undefined is not JSON serializable") << "tojson_undefined";
}

TEST(ChatTemplateLanguage, FiltersStrings) {
  EXPECT_EQ(R("{{ '  pad  ' | trim }}|{{ 'xxhixx' | trim('x') }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}|{{ 'a-b c(d' | title }}|{{ 'abc' | upper }}{{ 'ABC' | lower }}|{{ 'aaa' | replace('a', 'b', 2) }}|{{ 'one two  three' | wordcount }}|{{ 'x' | center(5) }}|{{ 'abc' | reverse }}|{{ 42 | string }}|{{ '<&>' | e }}", "{}"), "pad|hi|Hello World|Hello|A-B C(D|ABCabc|bba|3|  x  |cba|42|&lt;&amp;&gt;") << "filters_strings";
}

TEST(ChatTemplateLanguage, FiltersLists) {
  EXPECT_EQ(R("{{ users | map(attribute='name') | join(', ') }}|{{ users | selectattr('admin') | map(attribute='name') | list }}|{{ users | rejectattr('admin') | map(attribute='name') | join }}|{{ users | selectattr('age', 'gt', 25) | list | length }}|{{ users | sort(attribute='name') | map(attribute='age') | join('-') }}|{{ users | map(attribute='missing', default='?') | join }}|{{ users | sum(attribute='age') }}|{{ users | max(attribute='age') }}|{{ users | min(attribute='name') }}", "{\"users\": [{\"name\": \"b\", \"age\": 30, \"admin\": true}, {\"name\": \"a\", \"age\": 20}, {\"name\": \"c\", \"age\": 40, \"admin\": false}]}"), "b, a, c|['b']|ac|2|20-30-40|???|90|{'name': 'c', 'age': 40, 'admin': False}|{'name': 'a', 'age': 20}") << "filters_lists";
}

TEST(ChatTemplateLanguage, FiltersLists2) {
  EXPECT_EQ(R("{{ [3, 1, 2] | sort }}|{{ [3, 1, 2] | sort(reverse=true) }}|{{ ['B', 'a', 'C'] | sort }}|{{ ['a', 'A', 'b', 'a'] | unique | list }}|{{ [1, 2, 3] | first }}{{ [1, 2, 3] | last }}|{{ [] | first }}|{{ [1, 2] | reverse | list }}|{{ [1, 2, 3, 4, 5] | batch(2) | list }}|{{ ['x', 'y'] | map('upper') | list }}|{{ [0, 1, '', 'a', none] | select | list }}|{{ [1, 2, 3, 4] | reject('odd') | list }}|{{ {'b': 1, 'a': 2} | dictsort }}|{{ 'abc' | list }}|{{ [1, 2, 3] | count }}", "{}"), "[1, 2, 3]|[3, 2, 1]|['a', 'B', 'C']|['a', 'b']|13||[2, 1]|[[1, 2], [3, 4], [5]]|['X', 'Y']|[1, 'a']|[2, 4]|[('a', 2), ('b', 1)]|['a', 'b', 'c']|3") << "filters_lists2";
}

TEST(ChatTemplateLanguage, FiltersNumbers) {
  EXPECT_EQ(R("{{ '42' | int }}|{{ '4.7' | int }}|{{ 'x' | int }}|{{ 'x' | int(7) }}|{{ 3.9 | int }}|{{ '0x1A' | int(base=16) }}|{{ '3.5' | float }}|{{ 'q' | float }}|{{ 2.5 | round }}|{{ 3.14159 | round(2) }}|{{ 3.1 | round(method='ceil') }}|{{ 17 | round(-1) }}|{{ -5 | abs }}|{{ [1.5, 2] | sum }}", "{}"), "42|4|0|7|3|26|3.5|0.0|2.0|3.14|4.0|20|5|3.5") << "filters_numbers";
}

TEST(ChatTemplateLanguage, FilterDefault) {
  EXPECT_EQ(R("{{ missing | default('dflt') }}|{{ missing | d('d2') }}|{{ '' | default('empty') }}|{{ '' | default('empty', true) }}|{{ none | default('n') }}|{{ false | default('f', boolean=true) }}", "{}"), "dflt|d2||empty|None|f") << "filter_default";
}

TEST(ChatTemplateLanguage, FilterIndent) {
  EXPECT_EQ(R("{{ 'a\\nb\\n\\nc' | indent(2) }}|{{ 'a\\nb' | indent(2, first=true) }}|{{ 'a\\n\\nb' | indent('> ', blank=true) }}", "{}"), "a\n  b\n\n  c|  a\n  b|a\n> \n> b") << "filter_indent";
}

TEST(ChatTemplateLanguage, FilterFormat) {
  EXPECT_EQ(R("{{ '%s is %d years, %.2f%%' | format('Ann', 30, 99.5) }}|{{ '%(a)s-%(b)05.1f' % {'a': 'x', 'b': 3.14159} }}|{{ '%5s|%-5s|%03d|%x|%r' % ('ab', 'cd', 7, 255, 'q') }}", "{}"), "Ann is 30 years, 99.50%|x-003.1|   ab|cd   |007|ff|'q'") << "filter_format";
}

TEST(ChatTemplateLanguage, FilterSafe) {
  EXPECT_EQ(R("{{ '<b>' | safe }}|{{ ('<b>' | safe) + '<i>' }}|{{ '<i>' + ('<b>' | safe) }}|{{ '<b>' | safe ~ '<i>' }}|{{ ('<b>' | safe) is escaped }}", "{}"), "<b>|<b>&lt;i&gt;|&lt;i&gt;<b>|<b><i>|True") << "filter_safe";
}

TEST(ChatTemplateLanguage, Tests) {
  EXPECT_EQ(R("{{ s is string }}{{ n is string }}|{{ d is mapping }}{{ l is mapping }}|{{ l is iterable }}{{ s is iterable }}{{ n is iterable }}{{ undefined_x is iterable }}|{{ d is sequence }}{{ n is sequence }}|{{ n is number }}{{ f is number }}{{ b is number }}{{ s is number }}|{{ n is integer }}{{ b is integer }}{{ f is float }}|{{ b is boolean }}{{ n is boolean }}|{{ b is true }}{{ 1 is true }}{{ false is false }}|{{ z is none }}{{ u is none }}|{{ u is undefined }}{{ s is defined }}|{{ 4 is divisibleby 2 }}{{ 3 is even }}|{{ 'a' is in 'cat' }}{{ 2 is in l }}|{{ z is sameas none }}|{{ 'abc' is lower }}{{ 'ABC' is upper }}|{{ range is callable }}{{ s is callable }}|{{ 1 is eq 1 }}{{ 2 is gt 1 }}{{ 2 is lessthan 1 }}|{{ s is not string }}", "{\"s\": \"str\", \"n\": 3, \"f\": 1.5, \"l\": [1], \"d\": {\"a\": 1}, \"z\": null, \"b\": true}"), "TrueFalse|TrueFalse|TrueTrueFalseTrue|TrueFalse|TrueTrueTrueFalse|TrueFalseTrue|TrueFalse|TrueFalseTrue|TrueFalse|TrueTrue|TrueFalse|TrueFalse|True|TrueTrue|TrueFalse|TrueTrueFalse|False") << "tests";
}

TEST(ChatTemplateLanguage, StrMethods) {
  EXPECT_EQ(R("{{ 'hello'.startswith('he') }}{{ 'hello'.endswith(('x', 'lo')) }}|{{ 'a,b,,c'.split(',') }}|{{ '  a b  c '.split() }}|{{ 'a b c'.split(' ', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ '  x  '.strip() }}|{{ 'xxhixx'.lstrip('x') }}|{{ 'xxhixx'.rstrip('x') }}|{{ 'aaa'.replace('a', 'b') }}|{{ 'hello world'.title() }}|{{ 'hello'.capitalize() }}|{{ 'Hello'.upper() }}{{ 'Hello'.lower() }}|{{ '{} and {}'.format(1, 'two') }}|{{ '{0}{1}{0}'.format('a', 'b') }}|{{ '{name:>5}|{v:.2f}'.format(name='x', v=3.14159) }}|{{ 'hello'.find('l') }}{{ 'hello'.rfind('l') }}{{ 'hello'.find('z') }}|{{ 'banana'.count('a') }}|{{ '-'.join(['a', 'b']) }}|{{ 'a\\nb\\r\\nc'.splitlines() }}|{{ 'k=v=w'.partition('=') }}|{{ 'abc'.isalpha() }}{{ '123'.isdigit() }}{{ ' '.isspace() }}", "{}"), "TrueTrue|['a', 'b', '', 'c']|['a', 'b', 'c']|['a', 'b c']|['a,b', 'c']|x|hixx|xxhi|bbb|Hello World|Hello|HELLOhello|1 and two|aba|    x|3.14|23-1|3|a-b|['a', 'b', 'c']|('k', '=', 'v=w')|TrueTrueTrue") << "str_methods";
}

TEST(ChatTemplateLanguage, StrMethodsUnicode) {
  EXPECT_EQ(R("{{ 'grün'.upper() }}|{{ 'ÉCOLE'.lower() }}|{{ 'héllo'.find('l') }}|{{ '  é  '.strip() }}|{{ 'é,ü'.split(',') }}|{{ 'añb'.center(7, '*') }}", "{}"), "GRÜN|école|2|é|['é', 'ü']|**añb**") << "str_methods_unicode";
}

TEST(ChatTemplateLanguage, DictMethods) {
  EXPECT_EQ(R("{{ d.items() | list }}|{{ d.keys() | list }}|{{ d.values() | list }}|{{ d.get('a') }}{{ d.get('x') }}{{ d.get('x', 'dflt') }}|{{ d['b'] }}{{ d.b }}|{{ d | length }}|{{ dict(x=1, y=2) }}|{{ dict({'a': 1}, b=2) }}", "{\"d\": {\"b\": 1, \"a\": 2}}"), "[('b', 1), ('a', 2)]|['b', 'a']|[1, 2]|2Nonedflt|11|2|{'x': 1, 'y': 2}|{'a': 1, 'b': 2}") << "dict_methods";
}

TEST(ChatTemplateLanguage, AttrVsItem) {
  EXPECT_EQ(R("{{ d.type }}|{{ d['items'] }}|{{ d.items is callable }}|{{ d | attr('type') }}", "{\"d\": {\"items\": \"key-items\", \"type\": \"t\"}}"), "t|key-items|True|") << "attr_vs_item";
}

TEST(ChatTemplateLanguage, UndefinedPrint) {
  EXPECT_EQ(R("[{{ nothing }}]{{ nothing ~ 'x' }}{{ nothing | length }}{{ nothing | string }}{{ 'a' in nothing }}{% for x in nothing %}never{% endfor %}{{ nothing is defined }}{{ nothing == nothing }}{{ nothing | upper }}", "{}"), "[]x0FalseFalseTrue") << "undefined_print";
}

TEST(ChatTemplateLanguage, UndefinedAttrError) {
  // undefined_attr_error: UndefinedError: 'nothing' is undefined
  EXPECT_ERR(R("{{ nothing.attr }}", "{}"), "'nothing' is undefined") << "undefined_attr_error";
}

TEST(ChatTemplateLanguage, UndefinedAttrDefinedError) {
  // undefined_attr_defined_error: UndefinedError: 'nothing' is undefined
  EXPECT_ERR(R("{{ nothing.attr is defined }}", "{}"), "'nothing' is undefined") << "undefined_attr_defined_error";
}

TEST(ChatTemplateLanguage, UndefinedAddError) {
  // undefined_add_error: UndefinedError: 'nothing' is undefined
  EXPECT_ERR(R("{{ nothing + 1 }}", "{}"), "'nothing' is undefined") << "undefined_add_error";
}

TEST(ChatTemplateLanguage, UndefinedKeyIsUndefined) {
  EXPECT_EQ(R("[{{ d.missing }}][{{ d['missing'] }}][{{ l[5] }}]{{ d.missing is defined }}{{ none.attr is defined }}", "{\"d\": {\"a\": 1}, \"l\": [1]}"), "[][][]FalseFalse") << "undefined_key_is_undefined";
}

TEST(ChatTemplateLanguage, UndefinedKeyChainError) {
  // undefined_key_chain_error: UndefinedError: 'dict object' has no attribute 'missing'
  EXPECT_ERR(R("{{ d.missing.deeper }}", "{\"d\": {\"a\": 1}}"), "'dict object' has no attribute 'missing'") << "undefined_key_chain_error";
}

TEST(ChatTemplateLanguage, ListIndexErrorMessage) {
  // list_index_error_message: UndefinedError: list object has no element 5
  EXPECT_ERR(R("{{ l[5].x }}", "{\"l\": [1]}"), "list object has no element 5") << "list_index_error_message";
}

TEST(ChatTemplateLanguage, Raise) {
  // raise: TemplateError: custom failure: 42
  EXPECT_ERR(R("{% if true %}{{ raise_exception('custom failure: ' ~ 42) }}{% endif %}", "{}"), "custom failure: 42") << "raise";
}

TEST(ChatTemplateLanguage, ZeroDivision) {
  // zero_division: ZeroDivisionError: division by zero
  EXPECT_ERR(R("{{ 1 / 0 }}", "{}"), "division by zero") << "zero_division";
}

TEST(ChatTemplateLanguage, TypeErrorAdd) {
  // type_error_add: TypeError: unsupported operand type(s) for +: 'int' and 'str'
  EXPECT_ERR(R("{{ 1 + 'a' }}", "{}"), "unsupported operand type(s) for +: 'int' and 'str'") << "type_error_add";
}

TEST(ChatTemplateLanguage, TypeErrorConcatStr) {
  // type_error_concat_str: TypeError: can only concatenate str (not "int") to str
  EXPECT_ERR(R("{{ 'a' + 1 }}", "{}"), "can only concatenate str (not \"int\") to str") << "type_error_concat_str";
}

TEST(ChatTemplateLanguage, NotCallable) {
  // not_callable: TypeError: 'str' object is not callable
  EXPECT_ERR(R("{{ 'abc'() }}", "{}"), "'str' object is not callable") << "not_callable";
}

TEST(ChatTemplateLanguage, UnsafeAppend) {
  // unsafe_append: SecurityError: access to attribute 'append' of 'list' object is unsafe.
  EXPECT_ERR(R("{% set l = [1] %}{{ l.append(2) }}", "{}"), "access to attribute 'append' of 'list' object is unsafe.") << "unsafe_append";
}

TEST(ChatTemplateLanguage, RangeForms) {
  EXPECT_EQ(R("{{ range(3) | list }}{{ range(1, 7, 2) | list }}{{ range(5, 0, -2) | list }}{{ range(0) | list }}", "{}"), "[0, 1, 2][1, 3, 5][5, 3, 1][]") << "range_forms";
}

TEST(ChatTemplateLanguage, RangeTooBig) {
  // range_too_big: OverflowError: Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).
  EXPECT_ERR(R("{{ range(1000000000) | length }}", "{}"), "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).") << "range_too_big";
}

TEST(ChatTemplateLanguage, Strftime) {
  EXPECT_EQ(R("{{ strftime_now('%Y-%m-%d %B %d, %Y %A %H:%M:%S') }}", "{}"), "2024-07-26 July 26, 2024 Friday 09:05:03") << "strftime";
}

TEST(ChatTemplateLanguage, IntFloatPrint) {
  EXPECT_EQ(R("{{ 10 / 4 }} {{ 10 / 5 }} {{ 3 * 1.1 }} {{ 1e100 }} {{ 123456789.123456789 }} {{ 2 ** 62 }}", "{}"), "2.5 2.0 3.3000000000000003 1e+100 123456789.12345679 4611686018427387904") << "int_float_print";
}

TEST(ChatTemplateLanguage, IsTestsChain) {
  EXPECT_EQ(R("{{ [1, 2] is sequence and 'x' is not mapping }}", "{}"), "True") << "is_tests_chain";
}

TEST(ChatTemplateLanguage, JoinAttribute) {
  EXPECT_EQ(R("{{ ms | join('+', attribute='c') }}", "{\"ms\": [{\"c\": \"a\"}, {\"c\": \"b\"}]}"), "a+b") << "join_attribute";
}

TEST(ChatTemplateLanguage, StringEscapesInLiterals) {
  EXPECT_EQ(R("{{ \"line1\\nline2\" }}|{{ 'back\\\\slash' }}|{{ 'q\\\"q' }}|{{ '\\101' }}|{{ '\\z' }}", "{}"), "line1\nline2|back\\slash|q\"q|A|\\z") << "string_escapes_in_literals";
}

TEST(ChatTemplateLanguage, GenerationBlock) {
  // Hugging Face's AssistantTracker: the block renders its body unchanged.
  EXPECT_EQ(R("{% generation %}gen {{ 1 }}{% endgeneration %}", "{}"), "gen 1") << "generation_block";
}

TEST(ChatTemplateLanguage, MapFilterArgs) {
  EXPECT_EQ(R("{{ ['a-b', 'c-d'] | map('replace', '-', '+') | join(',') }}", "{}"), "a+b,c+d") << "map_filter_args";
}

TEST(ChatTemplateLanguage, SelectattrEqualto) {
  EXPECT_EQ(R("{{ ms | selectattr('role', 'equalto', 'user') | list | length }}{{ (ms | selectattr('role', 'equalto', 'user') | list)[-1] == ms[2] }}\n", "{\"ms\": [{\"role\": \"user\"}, {\"role\": \"assistant\"}, {\"role\": \"user\"}]}"), "2True") << "selectattr_equalto";
}

// --- beyond the reference run above ---------------------------------------------------

TEST(ChatTemplateLanguage, SyntaxErrorsCarryTheLine) {
  auto line_of = [](const std::string& src) {
    try {
      tessera::ChatTemplate t(src);
    } catch (const tessera::ChatTemplateError& e) {
      EXPECT_EQ(e.kind(), tessera::ChatTemplateError::Kind::Syntax) << e.what();
      return e.line();
    }
    ADD_FAILURE() << "no syntax error in: " << src;
    return -1;
  };
  EXPECT_EQ(line_of("line 1\n{% if x %}\nno endif\n"), 3);
  EXPECT_EQ(line_of("a\nb\n{{ 1 + }}"), 3);
  EXPECT_EQ(line_of("{% for x in y %}\n{% endif %}"), 2);
  EXPECT_EQ(line_of("\n\n\n{% frobnicate %}"), 4);
  EXPECT_EQ(line_of("{{ 'unterminated }}"), 1);
  EXPECT_EQ(line_of("x\n{{ (1, 2 }}"), 2);
  EXPECT_EQ(line_of("x\n{# never closed"), 2);
  EXPECT_EQ(line_of("{% break %}"), 1);
  EXPECT_EQ(line_of("{% for x in y %}{% macro m() %}{% break %}{% endmacro %}{% endfor %}"), 1);
}

TEST(ChatTemplateLanguage, SyntaxErrorMessages) {
  try {
    tessera::ChatTemplate t("{% for x in y %}\nbody\n");
    FAIL();
  } catch (const tessera::ChatTemplateError& e) {
    EXPECT_EQ(std::string(e.what()),
              "chat template syntax error, line 2: Unexpected end of template. Jinja was looking for the following "
              "tags: 'endfor' or 'else'. The innermost block that needs to be closed is 'for'.");
  }
}

TEST(ChatTemplateLanguage, RuntimeErrorsCarryTheLine) {
  try {
    R("line 1\n{% set x = 1 %}\n{{ x + 'a' }}", "{}");
    FAIL();
  } catch (const tessera::ChatTemplateError& e) {
    EXPECT_EQ(e.kind(), tessera::ChatTemplateError::Kind::Runtime);
    EXPECT_EQ(e.line(), 3);
    EXPECT_EQ(std::string(e.what()), "chat template error, line 3: unsupported operand type(s) for +: 'int' and 'str'");
  }
  // raise_exception: what() is exactly the template's message
  try {
    R("{{ raise_exception('Only user and assistant roles are supported!') }}", "{}");
    FAIL();
  } catch (const tessera::ChatTemplateError& e) {
    EXPECT_EQ(e.kind(), tessera::ChatTemplateError::Kind::Raised);
    EXPECT_EQ(std::string(e.what()), "Only user and assistant roles are supported!");
  }
}

TEST(ChatTemplateLanguage, UnknownFiltersAndTestsFailOnlyWhenReached) {
  EXPECT_EQ(R("{% if false %}{{ x | no_such_filter }}{{ x is no_such_test }}{% endif %}ok", "{}"), "ok");
  EXPECT_ERR(R("{{ 1 | no_such_filter }}", "{}"), "No filter named 'no_such_filter'.");
  EXPECT_ERR(R("{{ 1 is no_such_test }}", "{}"), "No test named 'no_such_test'.");
}

TEST(ChatTemplateLanguage, NamespaceAttributeOfNonNamespace) {
  EXPECT_ERR(R("{% set d = {} %}{% set d.x = 1 %}", "{}"), "cannot assign attribute on non-namespace object");
}

TEST(ChatTemplateLanguage, CrlfTemplatesNormalise) {
  EXPECT_EQ(R("{% if true %}\r\na\r\n{% endif %}\r\nb\r\n", "{}"), "a\nb");
}

TEST(ChatTemplateLanguage, ParsedOnceRenderedManyTimes) {
  tessera::ChatTemplate t("{% for m in messages %}{{ m.role }}:{{ m.content }};{% endfor %}");
  for (int i = 0; i < 3; ++i) {
    ojson vars = {{"messages", ojson::array({ojson{{"role", "user"}, {"content", std::to_string(i)}}})}};
    EXPECT_EQ(t.render(vars), "user:" + std::to_string(i) + ";");
  }
}

TEST(ChatTemplateLanguage, VariablesMustBeAnObject) {
  tessera::ChatTemplate t("x");
  EXPECT_THROW(t.render(ojson::array({1, 2})), tessera::ChatTemplateError);
  EXPECT_EQ(t.render(ojson()), "x");  // null: no variables
}

TEST(ChatTemplateLanguage, StrftimeNowDefaultsToTheClock) {
  std::string year = tessera::ChatTemplate("{{ strftime_now('%Y') }}").render(ojson::object());
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

TEST(ChatTemplateLanguage, InvalidUtf8NeverCrashes) {
  std::string bad = "{{ '\xff\xfe' | length }}{{ '\xe2\x82' | tojson }}{{ '\xc3'[::-1] }}{{ '\xf0\x9f' | upper }}";
  EXPECT_NO_THROW(R(bad, "{}"));
}

}  // namespace
