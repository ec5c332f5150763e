/* volk's implementation (Debian's libvulkan-volk-dev ships it as a source file). */
#include <volk.c>
