#pragma once
// Narrowing a regex (a JSON Schema "pattern", as xgrammar's regex reads it) so that no match
// holds one ASCII character. The XML tool-call formats write a string parameter raw and end it
// at the first marker; every marker starts with '<', so a forced call's raw value must never
// write one (http/forced_tool_call.cc).
#include <string>
#include <string_view>

namespace metrale::grammar {

// `pattern` with `c` taken out of everything that could match it: '.' becomes [^c\n\r], a
// negated class [^...] gains c, a positive class loses c (a range over it is split around it),
// and \S, \W, \D outside a class become [^\s c], [^\w c], [^\d c]. Every string the result
// matches, `pattern` matches. Throws an Error naming `what` and the offset where the pattern
// cannot do without c: c written outside a class (plainly or escaped), a class that holds
// nothing but c, or \S, \W, \D inside a positive class. `c` must be printable ASCII and not a
// regex metacharacter.
std::string pattern_without(std::string_view pattern, char c, const std::string& what);

}  // namespace metrale::grammar
