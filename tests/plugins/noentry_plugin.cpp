// Test-only shared object that is not a tessera plugin: no tessera_plugin_entry (and
// no tessera header).
extern "C" __attribute__((visibility("default"))) int not_a_tessera_plugin(void) { return 42; }
